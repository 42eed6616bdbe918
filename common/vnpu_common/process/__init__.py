"""The process plumbing of both commands: what they are started with, how
they log, the loop they run on and the port they serve. May import `kube`
and `wire` (see the package's map).

- `settings`: the settings both commands have (`ComponentSettings`): each
  one flag, one `VNPU_*` variable and one default.
- `flags`: the command line built from the settings model: one flag per
  setting, read over the environment, with `--help` and `--version`.
- `startup`: the checks before a start (where the API server is, whether the
  ports are free): one line naming the setting to fix and exit status 1.
- `logs`: one handler on stderr for every logger, as text or JSON lines.
- `eventloop`: the event loop both commands run on (uvloop's), with the
  `pauses` watch when it is asked for.
- `pauses`: the event loop's and the garbage collector's pauses, as log
  lines (`VNPU_DEBUG_PAUSES_MS`).
- `gcfreeze`: the garbage collector's full passes kept short (`gc.freeze`).
- `memory`: heap freed after a burst given back to the system (`malloc_trim`).
- `http`: the HTTP port of both commands: /metrics, /healthz and /readyz.
- `metrics_auth`: who may scrape /metrics, as the API server decides
  (TokenReview, SubjectAccessReview), over TLS.
- `metrics_registry`: the metrics registry each component starts from
  (process, platform and GC collectors, `<prefix>_build_info`).
"""
