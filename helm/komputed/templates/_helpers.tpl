{{/*
Names, labels and the daemon's flag file, shared by every template. Kubernetes names and label
values are at most 63 characters: every name here is truncated to that.
*/}}

{{/* The chart's name: nameOverride or "komputed". */}}
{{- define "komputed.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the resources: fullnameOverride, or "<release>-<name>", or the release name
alone when it already contains the chart's name.
*/}}
{{- define "komputed.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The headless Service's name: the full name, shortened so that "-headless" fits in 63. */}}
{{- define "komputed.headlessName" -}}
{{- printf "%s-headless" (include "komputed.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "komputed.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The namespace of every resource. */}}
{{- define "komputed.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "komputed.labels" -}}
helm.sh/chart: {{ include "komputed.chart" . }}
{{ include "komputed.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: daemon
app.kubernetes.io/part-of: komputed
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the pods: never change them in an upgrade (selectors are immutable). */}}
{{- define "komputed.selectorLabels" -}}
app.kubernetes.io/name: {{ include "komputed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The ServiceAccount of the pods. */}}
{{- define "komputed.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "komputed.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image: [registry/]repository, then @digest or :tag (appVersion by default). */}}
{{- define "komputed.image" -}}
{{- $repository := .Values.image.repository }}
{{- if .Values.image.registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .Values.image.registry) .Values.image.repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/* The name of the Secret mounted in the pods, or "" when there is none. */}}
{{- define "komputed.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else if .Values.secret.create }}
{{- include "komputed.fullname" . }}
{{- end }}
{{- end }}

{{/*
The daemon's flag file (absl --flagfile: one --name=value a line, "#" starts a comment). The
ConfigMap holds it; the DaemonSet's checksum/config annotation hashes it.
*/}}
{{- define "komputed.flags" -}}
# komputed flags, from the komputed Helm chart's values (config.*).
--listen=0.0.0.0:{{ .Values.config.grpcPort | int }}
--metrics_listen=0.0.0.0:{{ .Values.config.metricsPort | int }}
{{- with .Values.config.devices }}
--devices={{ . }}
{{- end }}
--session_idle_timeout={{ .Values.config.sessionIdleTimeoutSeconds | int }}s
--drain_timeout={{ .Values.config.drainTimeoutSeconds | int }}s
{{- if .Values.config.maxMessageBytes }}
--max_message_bytes={{ .Values.config.maxMessageBytes | int64 }}
{{- end }}
--log_level={{ .Values.config.logLevel }}
{{- range .Values.config.extraFlags }}
{{ . }}
{{- end }}
{{- end }}
