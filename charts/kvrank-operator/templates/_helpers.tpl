{{/* Chart name (nameOverride replaces it), cut to 63 characters (a DNS label). */}}
{{- define "kvrank-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified name: fullnameOverride, else release + name unless the release already
contains the name. */}}
{{- define "kvrank-operator.fullname" -}}
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

{{/* The namespace everything goes in: namespaceOverride, else the release's. */}}
{{- define "kvrank-operator.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
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
  verbs: [create, patch, delete]  # delete: the router's, when routing goes back to none
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, patch, delete]  # delete: the router's, when routing goes back to none
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
{{- if .Values.rbac.gatewayRouting }}
# routing.mode gateway: the HTTPRoute and its BackendTrafficPolicy (read back: the route's
# status says whether its Gateway accepted it)
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, create, patch, delete]
- apiGroups: [gateway.envoyproxy.io]
  resources: [backendtrafficpolicies]
  verbs: [create, patch, delete]
{{- end }}
{{- if .Values.monitoring.podMonitor.enabled }}
# a PodMonitor next to each RankerDeployment (removed with it by garbage collection)
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [create, patch]
{{- end }}
{{- end -}}

{{/* kvrank's alerts, as PrometheusRule groups (also rendered alone for promtool). Series
are grouped by the PodMonitor's target labels: the pod's namespace and the
RankerDeployment (app_kubernetes_io_instance). */}}
{{- define "kvrank-operator.ruleGroups" -}}
{{- $r := .Values.monitoring.rules -}}
{{- $by := "namespace, app_kubernetes_io_instance" -}}
groups:
  - name: kvrank.rankers
    rules:
      - alert: KvrankCacheHitRatioLow
        expr: |
          sum by ({{ $by }}) (rate(kvrank_requests_total{outcome=~"l1|host|l2|incremental"}[{{ $r.hitRatioWindow }}]))
            / sum by ({{ $by }}) (rate(kvrank_requests_total{outcome!="none"}[{{ $r.hitRatioWindow }}]))
            < {{ $r.hitRatioMin }}
        for: {{ $r.hitRatioFor }}
        labels:
          severity: warning
        annotations:
          runbook_url: "{{ $r.runbookBaseUrl }}#kvrankcachehitratiolow"
          summary: "{{`{{ $labels.namespace }}/{{ $labels.app_kubernetes_io_instance }}`}}: cache hit ratio {{`{{ $value | humanizePercentage }}`}}"
          description: "Fewer than {{ $r.hitRatioMin }} of the requests were served from a cache for {{ $r.hitRatioFor }}: every miss is a full user-side encode. Check the TTL in force (status.ttl), Redis (KvrankRedisBreakerOpen) and whether a new model version just rolled out."
      - alert: KvrankLatencyP99High
        expr: |
          histogram_quantile(0.99, sum by ({{ $by }}, le) (rate(kvrank_request_seconds_bucket[5m])))
            > {{ $r.p99Seconds }}
        for: 10m
        labels:
          severity: warning
        annotations:
          runbook_url: "{{ $r.runbookBaseUrl }}#kvranklatencyp99high"
          summary: "{{`{{ $labels.namespace }}/{{ $labels.app_kubernetes_io_instance }}`}}: p99 scoring latency {{`{{ $value | humanizeDuration }}`}}"
          description: "The 99th percentile of kvrank_request_seconds (every cache outcome) is above {{ $r.p99Seconds }} s."
      - alert: KvrankRedisBreakerOpen
        # over a minute: while Redis stays down the breaker half-opens every few seconds
        # for one trial request, which must not reset the alert
        expr: max by (namespace, pod) (max_over_time(kvrank_redis_circuit_open[1m])) == 1
        for: {{ $r.breakerFor }}
        labels:
          severity: critical
        annotations:
          runbook_url: "{{ $r.runbookBaseUrl }}#kvrankredisbreakeropen"
          summary: "{{`{{ $labels.namespace }}/{{ $labels.pod }}`}}: Redis unreachable, serving from L1 only"
          description: "The ranker's L2 circuit breaker is open: Redis failed repeatedly. Requests still succeed (a cache failure is a miss) but every pod encodes users on its own."
      - alert: KvrankRedisErrors
        expr: sum by ({{ $by }}) (rate(kvrank_redis_errors_total[5m])) > {{ $r.redisErrorsPerSecond }}
        for: 5m
        labels:
          severity: warning
        annotations:
          runbook_url: "{{ $r.runbookBaseUrl }}#kvrankrediserrors"
          summary: "{{`{{ $labels.namespace }}/{{ $labels.app_kubernetes_io_instance }}`}}: {{`{{ $value | humanize }}`}} Redis errors/s"
          description: "Redis errors and timeouts above {{ $r.redisErrorsPerSecond }}/s (each one a cache miss)."
      - alert: KvrankFullEncodesSpike
        expr: |
          sum by ({{ $by }}) (rate(kvrank_user_encodes_total{kind="full"}[10m]))
            > {{ $r.encodeSpikeFactor }} * sum by ({{ $by }}) (rate(kvrank_user_encodes_total{kind="full"}[1h] offset 1h))
        for: 10m
        labels:
          severity: info
        annotations:
          runbook_url: "{{ $r.runbookBaseUrl }}#kvrankfullencodesspike"
          summary: "{{`{{ $labels.namespace }}/{{ $labels.app_kubernetes_io_instance }}`}}: full user encodes {{ $r.encodeSpikeFactor }}× the hour before"
          description: "Usually a new model version (an empty cache namespace) or a flushed Redis; expected after a rollout, worth a look otherwise."
  - name: kvrank.operator
    rules:
      - alert: KvrankTTLNotTuned
        expr: min by (rankerdeployment_namespace, rankerdeployment) (kvrank_operator_ttl_source_ok) == 0
        for: {{ $r.ttlNotTunedFor }}
        labels:
          severity: warning
        annotations:
          runbook_url: "{{ $r.runbookBaseUrl }}#kvrankttlnottuned"
          summary: "{{`{{ $labels.rankerdeployment_namespace }}/{{ $labels.rankerdeployment }}`}}: the TTL tuner reads no request intervals"
          description: "The TTLSource condition says why (PrometheusUnreachable, QueryFailed or NoData, with the query); the TTL in force stays as it was."
      - alert: KvrankCanaryAborted
        expr: sum by (rankerdeployment_namespace, rankerdeployment) (increase(kvrank_operator_events_total{reason="CanaryAborted"}[15m])) > 0
        labels:
          severity: info
        annotations:
          runbook_url: "{{ $r.runbookBaseUrl }}#kvrankcanaryaborted"
          summary: "{{`{{ $labels.rankerdeployment_namespace }}/{{ $labels.rankerdeployment }}`}}: a canary was aborted"
          description: "Its cache namespace was retired and purged; the stable version serves all traffic."
      - alert: KvrankOperatorNoLeader
        expr: max(kvrank_operator_leader) < 1 or absent(kvrank_operator_leader)
        for: 5m
        labels:
          severity: critical
        annotations:
          runbook_url: "{{ $r.runbookBaseUrl }}#kvrankoperatornoleader"
          summary: "No kvrank operator replica holds the Lease"
          description: "RankerDeployments are not reconciled: rollouts, purges, TTL tuning and Redis healing are stopped."
{{- end -}}

{{/*
An image reference from {repository, tag, digest}: repository[:tag][@digest]; an empty tag
is the chart's appVersion where "appVersion" is given (kvrank's own images).
*/}}
{{- define "kvrank-operator.image" -}}
{{- $tag := .image.tag | default .appVersion -}}
{{- .image.repository -}}{{- if $tag }}:{{ $tag }}{{ end -}}{{- if .image.digest }}@{{ .image.digest }}{{ end -}}
{{- end -}}

{{/*
"true" when pods leave their uid and gid to the platform: podIds platform, or auto on a
cluster that serves security.openshift.io/v1 (OpenShift, whose restricted-v2 SCC assigns them
from the namespace's range and refuses pods that fix others); empty otherwise.
*/}}
{{- define "kvrank-operator.platformIds" -}}
{{- if or (eq .Values.podIds "platform") (and (eq .Values.podIds "auto") (.Capabilities.APIVersions.Has "security.openshift.io/v1")) -}}
true
{{- end -}}
{{- end }}
