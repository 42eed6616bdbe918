"""The product image built without Docker, from `Dockerfile` itself (`make image`).

- `build`: the stages run in order, each in its own root; one OCI archive,
  verified before it is cached.
- `dockerfile`: `Dockerfile` read as Docker reads it, into a plan; what it
  cannot follow is refused with its line.
- `chroot`: one command in a root filesystem, as a RUN (`rw`) or as the
  finished image runs (`ro`).
"""
