{{- define "otelkit-fleet.fullname" -}}
{{- printf "%s-fleet" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "otelkit-fleet.labels" -}}
app.kubernetes.io/name: otelkit-fleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "otelkit-fleet.selector" -}}
app.kubernetes.io/name: otelkit-fleet
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The registry's URL: the release's etcd, or the site's */}}
{{- define "otelkit-fleet.etcd" -}}
{{- if .Values.etcd.enabled -}}
{{- printf "http://%s-etcd:2379" (include "otelkit-fleet.fullname" .) -}}
{{- else -}}
{{- required "etcd.url: the site's etcd, when etcd.enabled is false" .Values.etcd.url -}}
{{- end -}}
{{- end -}}
