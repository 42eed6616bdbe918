{{- /*
How the components serve /metrics (docs/HELM.md, "A hardened install"). metrics.auth=kubernetes:
TLS, and only a bearer token the API server lets get /metrics; metrics.host other than
0.0.0.0: /metrics for a sidecar in the pod only. Either way the kubelet's probes go to a
port of their own (plain HTTP, /healthz and /readyz only): probePort.
*/ -}}
{{- define "vnpu.metrics.secured" -}}
{{- if or (eq .Values.metrics.auth "kubernetes") (ne .Values.metrics.host "0.0.0.0") -}}true{{- end -}}
{{- end -}}

{{- /* The env both components get for their /metrics port; the argument: (dict "root" . "probePort" N). */ -}}
{{- define "vnpu.metrics.env" -}}
{{- $root := .root -}}
- name: VNPU_METRICS_HOST
  value: {{ $root.Values.metrics.host | quote }}
- name: VNPU_METRICS_AUTH
  value: {{ $root.Values.metrics.auth | quote }}
- name: VNPU_METRICS_POD_NAMES
  value: {{ $root.Values.metrics.podNames | quote }}
{{- if include "vnpu.metrics.secured" $root }}
- name: VNPU_PROBE_PORT
  value: {{ .probePort | quote }}
{{- end }}
{{- end -}}

{{- /* The port the probes use: "probes" when /metrics is secured, else "metrics". */ -}}
{{- define "vnpu.metrics.probePortName" -}}
{{- if include "vnpu.metrics.secured" . -}}probes{{- else -}}metrics{{- end -}}
{{- end -}}

{{- /* The rules a component needs to check scrapers' tokens (with metrics.auth=kubernetes). */ -}}
{{- define "vnpu.metrics.reviewRules" -}}
# metrics.auth=kubernetes: whose is a scraper's token, and may it get /metrics.
- apiGroups: [authentication.k8s.io]
  resources: [tokenreviews]
  verbs: [create]
- apiGroups: [authorization.k8s.io]
  resources: [subjectaccessreviews]
  verbs: [create]
{{- end -}}
