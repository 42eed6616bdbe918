{{- define "vnpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vnpu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "vnpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "vnpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vnpu-operator
{{- end -}}

{{- define "vnpu.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vnpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "vnpu.agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vnpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "vnpu.operator.fullname" -}}
{{- printf "%s-operator" (include "vnpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vnpu.agent.fullname" -}}
{{- printf "%s-agent" (include "vnpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vnpu.webhook.serviceName" -}}
{{- printf "%s-webhook" (include "vnpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vnpu.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "vnpu.operator.fullname" .) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "vnpu.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (include "vnpu.agent.fullname" .) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /*
repository:tag, or repository@digest (repository:tag@digest with a tag set) when
image.digest pins it: the runtime then pulls by content, whatever the tag now names.
*/ -}}
{{- define "vnpu.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{- if $image.tag -}}
{{- printf "%s:%s@%s" $image.repository $image.tag $image.digest -}}
{{- else -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- end -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{- /*
The node labels agent.npuNodeLabels may name, each a nodeSelectorTerm: vnpu (set by hand),
ascend (Ascend's device-plugin install), nfd (node-feature-discovery: PCI class 1200,
processing accelerator, of vendor 19e5, Huawei).
*/ -}}
{{- define "vnpu.agent.npuNodeTerms" -}}
{{- $terms := dict
  "vnpu" (dict "key" "vnpu.io/npu" "operator" "In" "values" (list "true"))
  "ascend" (dict "key" "accelerator" "operator" "In" "values" (list "huawei-Ascend910" "huawei-Ascend310P" "huawei-Ascend310"))
  "nfd" (dict "key" "feature.node.kubernetes.io/pci-1200_19e5.present" "operator" "In" "values" (list "true"))
-}}
{{- range .Values.agent.npuNodeLabels }}
- matchExpressions:
    - {{ get $terms . | toYaml | nindent 6 | trim }}
{{- end }}
{{- end -}}

{{- /*
agent.affinity with a required node affinity made from agent.npuNodeLabels, unless
agent.affinity brings its own nodeAffinity.
*/ -}}
{{- define "vnpu.agent.affinity" -}}
{{- $affinity := deepCopy .Values.agent.affinity -}}
{{- if and .Values.agent.npuNodeLabels (not (hasKey $affinity "nodeAffinity")) -}}
{{- $terms := include "vnpu.agent.npuNodeTerms" . | fromYamlArray -}}
{{- $_ := set $affinity "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $terms)) -}}
{{- end -}}
{{- with $affinity }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{- /*
The system-critical priority classes the release's pods use: what the criticalPodQuota
ResourceQuota has to match.
*/ -}}
{{- define "vnpu.criticalClasses" -}}
{{- $classes := list -}}
{{- range (list .Values.agent.priorityClassName .Values.operator.priorityClassName) -}}
{{- if and (has . (list "system-node-critical" "system-cluster-critical")) (not (has . $classes)) -}}
{{- $classes = append $classes . -}}
{{- end -}}
{{- end -}}
{{- toJson $classes -}}
{{- end -}}

{{- /*
The operator's username as the API server sees it: protection.operatorUsername, else the
operator ServiceAccount's. The protection policies exempt exactly this identity.
*/ -}}
{{- define "vnpu.operator.username" -}}
{{- if .Values.protection.operatorUsername -}}
{{- .Values.protection.operatorUsername -}}
{{- else -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "vnpu.operator.serviceAccountName" .) -}}
{{- end -}}
{{- end -}}

{{- /*
The agents' usernames, a JSON list: protection.agentUsernames, else the agent
ServiceAccount's. The allocation policy lets them change allocations.
*/ -}}
{{- define "vnpu.agent.usernames" -}}
{{- if .Values.protection.agentUsernames -}}
{{- toJson .Values.protection.agentUsernames -}}
{{- else -}}
{{- list (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "vnpu.agent.serviceAccountName" .)) | toJson -}}
{{- end -}}
{{- end -}}

{{- /*
apiServer.host/port as the in-cluster client settings both components read; explicit env
wins over the kubelet's Service variables of the same names.
*/ -}}
{{- define "vnpu.apiServerEnv" -}}
{{- with .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ $.Values.apiServer.port | quote }}
{{- end }}
{{- end -}}

{{- /*
"true" when any agent serves DRA: agent.dra (every NPU node) or agent.draNodeSelector (the
NPU nodes it selects); "" otherwise. Everything DRA renders (RBAC, the DeviceClass, the
operator's claim controller, the alerts) follows it.
*/ -}}
{{- define "vnpu.dra.on" -}}
{{- if or .Values.agent.dra .Values.agent.draNodeSelector -}}true{{- end -}}
{{- end -}}

{{- /*
Refuses what cannot work: both DRA switches at once (which nodes would serve claims?), and
DRA below Kubernetes 1.36, where partitionable devices and binding conditions (beta, on from
1.36) are off and the scheduler would hand out devices without their counters or before
their vNPU exists.
*/ -}}
{{- define "vnpu.dra.check" -}}
{{- if and .Values.agent.dra .Values.agent.draNodeSelector -}}
{{- fail "agent.dra=true makes every NPU node a DRA node and agent.draNodeSelector only the nodes it selects: set one of them (docs/DRA.md, Which nodes)" -}}
{{- end -}}
{{- if and (include "vnpu.dra.on" .) (semverCompare "<1.36.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "agent.dra and agent.draNodeSelector need Kubernetes 1.36 or later (partitionable devices and binding conditions, beta and on from 1.36); this cluster is %s. Leave them off: the NPU nodes then serve pods by annotation (docs/DRA.md)" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{- /*
The node affinity of the annotation agents when agent.draNodeSelector splits the NPU nodes:
the terms that select NPU nodes (agent.affinity's required nodeSelectorTerms when it brings a
nodeAffinity, else agent.npuNodeLabels', else one empty term), each ANDed with one
`key NotIn [value]` per entry of agent.draNodeSelector. A node matches this exactly when it
is an NPU node and not a DRA node (the DRA agents take agent.draNodeSelector as their
nodeSelector), so the two DaemonSets never share a node.
*/ -}}
{{- define "vnpu.agent.annotationAffinity" -}}
{{- $affinity := include "vnpu.agent.affinity" . | fromYaml | default dict -}}
{{- $node := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $base := get $required "nodeSelectorTerms" | default (list dict) -}}
{{- $terms := list -}}
{{- range $base -}}
{{- $term := . -}}
{{- range $key, $value := $.Values.agent.draNodeSelector -}}
{{- $t := deepCopy $term -}}
{{- $exprs := get $t "matchExpressions" | default list -}}
{{- $_ := set $t "matchExpressions" (append $exprs (dict "key" $key "operator" "NotIn" "values" (list $value))) -}}
{{- $terms = append $terms $t -}}
{{- end -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ = set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ = set $affinity "nodeAffinity" $node -}}
{{- toYaml $affinity -}}
{{- end -}}

{{- /* A label selector map as key=value,key2=value2 (sorted by key), as the operator reads
VNPU_DRA_NODE_SELECTOR. */ -}}
{{- define "vnpu.selectorString" -}}
{{- $pairs := list }}
{{- range $k, $v := . }}{{ $pairs = append $pairs (printf "%s=%s" $k $v) }}{{ end }}
{{- join "," $pairs }}
{{- end -}}
