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

{{/* What the operator does inside a namespace it manages: exactly the verbs its code uses.
Owned objects are applied server-side (create + patch) and removed by garbage collection;
only old versions' Deployments and Services are deleted by the operator itself. Secrets:
the generated Redis password is read and created, never listed or watched. */}}
{{- define "kvrank-operator.namespacedRules" -}}
- apiGroups: [kvrank.io]
  resources: [rankerdeployments]
  verbs: [get, list, watch, patch]
- apiGroups: [kvrank.io]
  resources: [rankerdeployments/status]
  verbs: [get, patch]
# list/watch on what it owns: a change wakes the owner's reconciler (the operator watches
# only objects with its managed-by label, the API server filters)
- apiGroups: [apps]
  resources: [deployments]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [create, patch, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, patch]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, patch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, patch]
# its pods: which versions still serve, start failures, readiness, their /metrics
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
