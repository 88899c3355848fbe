{{/* Chart name, cut to 63 characters (a DNS label). */}}
{{- define "kvrank-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified name: release + chart, unless the release already contains it. */}}
{{- define "kvrank-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selector labels: stable across upgrades (never the chart version). */}}
{{- define "kvrank-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvrank-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Common labels. */}}
{{- define "kvrank-operator.labels" -}}
{{ include "kvrank-operator.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kvrank-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvrank-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}
