{{- define "tailor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tailor.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "tailor.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "tailor.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "tailor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tailor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tailor.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tailor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tailor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tailor.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tailor.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- /* "true" when the admission webhook runs: enabled, and right-sizing is on. */ -}}
{{- define "tailor.webhook" -}}
{{- if and .Values.webhook.enabled .Values.settings.prometheusUrl }}true{{ end }}
{{- end }}

{{- define "tailor.webhookCertSecret" -}}
{{- default (printf "%s-webhook-cert" (include "tailor.fullname" .)) .Values.webhook.certSecret }}
{{- end }}

{{- define "tailor.webhookHost" -}}
{{- printf "%s.%s.svc" (include "tailor.fullname" .) .Release.Namespace }}
{{- end }}
