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

{{/*
The quotas of the tenants file and of --default_quota_<name>, in server/src/tenants.h's order
(tests/deploy/check_deploy.py checks that the two lists agree).
*/}}
{{- define "komputed.quotaNames" -}}
device_memory_bytes host_memory_bytes sessions objects_per_session inflight_submissions ops_per_sequence tensor_bytes dispatch_invocations source_bytes client_name_bytes kernel_time_ms
{{- end }}

{{/* The Secret with the tenants file, or "" when there is none. */}}
{{- define "komputed.tenantsSecretName" -}}
{{- if .Values.auth.tenants.existingSecret }}
{{- .Values.auth.tenants.existingSecret }}
{{- else if .Values.auth.tenants.create }}
{{- printf "%s-tenants" (include "komputed.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/* "true" when the daemon serves TLS (tls.enabled and a Secret to take the key from). */}}
{{- define "komputed.tlsOn" -}}
{{- if and .Values.tls.enabled .Values.tls.existingSecret }}true{{ end }}
{{- end }}

{{/* The Secret with the client CA (mutual TLS), or "" when mutual TLS is off. */}}
{{- define "komputed.clientCASecretName" -}}
{{- if and (include "komputed.tlsOn" .) .Values.tls.clientCA.enabled }}
{{- default .Values.tls.existingSecret .Values.tls.clientCA.existingSecret }}
{{- end }}
{{- end }}

{{/* Where the client CA file is in the pod: in the TLS Secret's folder, or its own. */}}
{{- define "komputed.clientCAPath" -}}
{{- if .Values.tls.clientCA.existingSecret }}
{{- printf "/etc/komputed/client-ca/%s" .Values.tls.clientCA.key }}
{{- else }}
{{- printf "/etc/komputed/tls/%s" .Values.tls.clientCA.key }}
{{- end }}
{{- end }}

{{/*
Refuses values that would leave the daemon, which listens on 0.0.0.0 in the pod, open or unable
to start: the message names the value to set. Included by daemonset.yaml.
*/}}
{{- define "komputed.validate" -}}
{{- $tenants := include "komputed.tenantsSecretName" . }}
{{- if not .Values.insecure }}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) }}
{{- fail "komputed: tls.enabled is true (the default) but tls.existingSecret is empty: set tls.existingSecret to a Secret with tls.crt and tls.key (kubectl create secret tls komputed-tls --cert=server.crt --key=server.key, or a cert-manager Certificate), or set tls.enabled=false to serve plaintext (tokens travel in the clear)" }}
{{- end }}
{{- if not (or $tenants .Values.tls.clientCA.enabled) }}
{{- fail "komputed: clients are not authenticated: set auth.tenants.existingSecret to a Secret whose key tenants.yaml is a tenants file (kubectl create secret generic komputed-tenants --from-file=tenants.yaml), or auth.tenants.create=true with auth.tenants.list, or tls.clientCA.enabled=true (mutual TLS); insecure=true serves every peer that reaches the port" }}
{{- end }}
{{- end }}
{{- if and .Values.tls.clientCA.enabled (not (include "komputed.tlsOn" .)) }}
{{- fail "komputed: tls.clientCA.enabled needs TLS: set tls.enabled=true and tls.existingSecret" }}
{{- end }}
{{- if and .Values.auth.tenants.create (not .Values.auth.tenants.existingSecret) (not .Values.auth.tenants.list) }}
{{- fail "komputed: auth.tenants.create is true but auth.tenants.list is empty: list the tenants, or set auth.tenants.existingSecret" }}
{{- end }}
{{- range .Values.auth.tenants.list }}
{{- if not .name }}
{{- fail "komputed: an entry of auth.tenants.list has no name" }}
{{- end }}
{{- if and .token_sha256 (not (regexMatch "^[0-9a-fA-F]{64}$" (toString .token_sha256))) }}
{{- fail (printf "komputed: auth.tenants.list %s: token_sha256 is not 64 hex digits (printf %%s \"$TOKEN\" | sha256sum)" .name) }}
{{- end }}
{{- end }}
{{- $healthPort := .Values.config.healthPort | int }}
{{- if or (lt $healthPort 1) (gt $healthPort 65535) (has $healthPort (list (.Values.config.grpcPort | int) (.Values.config.metricsPort | int))) }}
{{- fail (printf "komputed: config.healthPort (%v) must be a port from 1 to 65535 other than config.grpcPort (%v) and config.metricsPort (%v): the daemon serves the probes' plaintext health check there" .Values.config.healthPort .Values.config.grpcPort .Values.config.metricsPort) }}
{{- end }}
{{- $quotas := splitList " " (include "komputed.quotaNames" .) }}
{{- range $name, $value := .Values.auth.defaultQuota }}
{{- if not (has $name $quotas) }}
{{- fail (printf "komputed: auth.defaultQuota.%s is no quota (known: %s)" $name (join ", " $quotas)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The probes' check: the kubelet's native gRPC probe against grpc.health.v1.Health (service "") on
the health port (--health_listen), which is plain text even when the gRPC port serves TLS (the
kubelet's gRPC probe has no TLS). It sees draining and lost devices (NOT_SERVING), which a TCP
probe would not.
*/}}
{{- define "komputed.probeAction" -}}
grpc:
  port: {{ .Values.config.healthPort | int }}
{{- end }}

{{/*
The daemon's flag file (absl --flagfile: one --name=value a line, "#" starts a comment). The
ConfigMap holds it; the DaemonSet's checksum/config annotation hashes it. The files it names are
in Secrets mounted as folders, which the kubelet updates in place; the daemon re-reads them.
*/}}
{{- define "komputed.flags" -}}
# komputed flags, from the komputed Helm chart's values (config.*, auth.*, tls.*, insecure).
--listen=0.0.0.0:{{ .Values.config.grpcPort | int }}
--metrics_listen=0.0.0.0:{{ .Values.config.metricsPort | int }}
--health_listen=0.0.0.0:{{ .Values.config.healthPort | int }}
{{- with .Values.config.devices }}
--devices={{ . }}
{{- end }}
--session_idle_timeout={{ .Values.config.sessionIdleTimeoutSeconds | int }}s
--drain_timeout={{ .Values.config.drainTimeoutSeconds | int }}s
{{- if .Values.config.maxMessageBytes }}
--max_message_bytes={{ .Values.config.maxMessageBytes | int64 }}
{{- end }}
--log_level={{ .Values.config.logLevel }}
{{- if include "komputed.tenantsSecretName" . }}
--tenants_file=/etc/komputed/tenants/{{ .Values.auth.tenants.key }}
{{- end }}
{{- if include "komputed.tlsOn" . }}
--tls_cert=/etc/komputed/tls/{{ .Values.tls.certKey }}
--tls_key=/etc/komputed/tls/{{ .Values.tls.keyKey }}
{{- if .Values.tls.clientCA.enabled }}
--tls_client_ca={{ include "komputed.clientCAPath" . }}
{{- end }}
{{- end }}
{{- range $name, $value := .Values.auth.defaultQuota }}
--default_quota_{{ $name }}={{ $value | int64 }}
{{- end }}
{{- if .Values.insecure }}
--insecure
{{- end }}
{{- range .Values.config.extraFlags }}
{{ . }}
{{- end }}
{{- end }}
