#!/usr/bin/env bash
# End-to-end on kind (needs Docker, kind, kubectl, helm): build the image, load it, install
# the chart with driver=sim, run demo pods that ask for vNPUs and check the outcome, then
# release them and uninstall. This project's machines have no Docker engine; this script is
# for users who have one.
#
#   e2e/kind/run.sh            # create cluster "vnpu", test, keep the cluster
#   KEEP=0 e2e/kind/run.sh     # delete the cluster at the end
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CLUSTER=${CLUSTER:-vnpu}
IMAGE=${IMAGE:-vnpu-operator:e2e}
NS=${NS:-vnpu-system}
DEMO_NS=vnpu-demo
KEEP=${KEEP:-1}

log() { printf '\n==> %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || fail "$tool is not installed"
done

log "building $IMAGE"
docker build -t "$IMAGE" "$ROOT"

if ! kind get clusters | grep -qx "$CLUSTER"; then
  log "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --config "$ROOT/e2e/kind/kind-config.yaml" --wait 120s
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null
if [[ "$KEEP" == 0 ]]; then trap 'kind delete cluster --name "$CLUSTER"' EXIT; fi

log "loading the image into the nodes"
kind load docker-image "$IMAGE" --name "$CLUSTER"

# Simulated chips per NPU node (the sim driver reads this annotation).
for node in $(kubectl get nodes -l vnpu.io/npu=true -o name); do
  kubectl annotate "$node" sim.vnpu.io/chips=910B3=2 --overwrite
done

log "installing the chart (driver=sim)"
helm upgrade --install vnpu-operator "$ROOT/charts/vnpu-operator" -n "$NS" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
  --set image.pullPolicy=Never --set agent.driver=sim \
  --wait --timeout 5m
kubectl -n "$NS" rollout status deploy/vnpu-operator-operator --timeout=180s
kubectl -n "$NS" rollout status ds/vnpu-operator-agent --timeout=180s

log "waiting for the agents' inventories"
for i in $(seq 1 60); do
  n=$(kubectl get vnpunodes --no-headers 2>/dev/null | wc -l)
  [[ "$n" -ge 2 ]] && break
  [[ "$i" == 60 ]] && fail "only $n VNPUNode objects after 120s"
  sleep 2
done
kubectl get vnpunodes

log "the webhook is registered and refuses a bad request"
kubectl create namespace "$DEMO_NS" --dry-run=client -o yaml | kubectl apply -f -
for i in $(seq 1 30); do
  kubectl get mutatingwebhookconfiguration vnpu-operator \
    -o jsonpath='{.webhooks[0].clientConfig.caBundle}' | grep -q . && break
  [[ "$i" == 30 ]] && fail "the operator did not register its CA bundle"
  sleep 2
done
if out=$(kubectl -n "$DEMO_NS" run bad --image=busybox:1.36 --restart=Never \
    --annotations=vnpu.io/template=vir99_nope -- true 2>&1); then
  fail "a pod with an unknown template was admitted"
fi
echo "refused as expected: $out"

log "running demo pods"
for i in 1 2; do
  cat <<YAML | kubectl apply -f -
apiVersion: v1
kind: Pod
metadata:
  name: demo-$i
  namespace: $DEMO_NS
  annotations:
    vnpu.io/template: vir05_1c_16g
    vnpu.io/count: "1"
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: busybox:1.36
      command: ["sh", "-c", "echo ASCEND_VISIBLE_DEVICES=\$ASCEND_VISIBLE_DEVICES; sleep 3600"]
YAML
done
kubectl -n "$DEMO_NS" wait --for=condition=Ready pod/demo-1 pod/demo-2 --timeout=180s
kubectl get vnpuallocations -A
for i in 1 2; do
  devices=$(kubectl -n "$DEMO_NS" get pod "demo-$i" \
    -o jsonpath='{.metadata.annotations.vnpu\.io/visible-devices}')
  [[ -n "$devices" ]] || fail "demo-$i has no vnpu.io/visible-devices"
  kubectl -n "$DEMO_NS" logs "demo-$i" | grep -q "ASCEND_VISIBLE_DEVICES=$devices" \
    || fail "demo-$i does not see ASCEND_VISIBLE_DEVICES=$devices"
  phase=$(kubectl -n "$DEMO_NS" get vnpuallocations \
    -l "vnpu.io/pod-uid=$(kubectl -n "$DEMO_NS" get pod "demo-$i" -o jsonpath='{.metadata.uid}')" \
    -o jsonpath='{.items[*].status.phase}')
  [[ "$phase" == "Ready" ]] || fail "demo-$i allocation phase is '$phase'"
  echo "demo-$i: vNPU $devices Ready"
done

log "releasing: deleting the pods destroys their vNPUs"
kubectl -n "$DEMO_NS" delete pod demo-1 demo-2 --wait=true --timeout=180s
left=$(kubectl get vnpuallocations -A --no-headers 2>/dev/null | wc -l)
[[ "$left" == 0 ]] || fail "$left allocations left after the pods are gone"
present=$(kubectl get vnpunodes -o jsonpath='{.items[*].status.chips[*].vnpus[*].id}')
for i in $(seq 1 30); do
  [[ -z "$present" ]] && break
  sleep 2
  present=$(kubectl get vnpunodes -o jsonpath='{.items[*].status.chips[*].vnpus[*].id}')
done
[[ -z "$present" ]] || fail "vNPUs still present on the nodes: $present"

log "uninstalling (CRDs are kept)"
helm uninstall vnpu-operator -n "$NS" --wait
kubectl get mutatingwebhookconfiguration vnpu-operator 2>/dev/null \
  && fail "webhook configuration left behind"
kubectl get crd vnpuallocations.vnpu.io >/dev/null
echo
echo "PASS: kind e2e"
