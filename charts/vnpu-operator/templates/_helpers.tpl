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

{{- define "vnpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
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
