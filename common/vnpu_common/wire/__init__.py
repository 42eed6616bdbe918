"""The wire contract both components and the kubectl plugin read: pure data
and rules that import no Kubernetes client, no HTTP library and no event loop,
so the operator's pure rules may use all of it.

- `names`: every name the system puts on the wire (group, kinds, labels,
  annotations, finalizers, condition and Event reasons), in one place.
- `types`: `Raw`, a Kubernetes object as the API server sends it (parsed JSON).
- `models`: the pydantic models of vnpu.io/v1alpha1, the one definition of
  the VNPUNode and VNPUAllocation resources.
- `crdgen`: the CRD YAML of `crds/` generated from `models` (`make crds`;
  `--check` fails on drift).
- `quantity`: integer resource quantities as the API server writes them.
- `fits`: how many vNPUs of a template an empty chip holds, and a chip's
  largest template.
- `events`: the body of a core/v1 Event about an object a component manages.
- `patches`: the patch content types, JSON pointers and the guarded
  finalizer removal.
"""
