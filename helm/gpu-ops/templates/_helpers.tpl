{{/* Names and labels shared by every object. */}}
{{- define "gpu-ops.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-ops.fullname" -}}
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

{{- define "gpu-ops.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-ops.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpu-ops.labels" -}}
{{ include "gpu-ops.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-ops
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpu-ops.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpu-ops.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpu-ops.configMapName" -}}
{{- printf "%s-config" (include "gpu-ops.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-ops.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The environment variable that carries one secret: GPU_OPS_SECRET_<CHANNEL>_<FIELD>,
upper-cased, anything outside [A-Z0-9_] replaced by "_". Argument: list channel field.
*/}}
{{- define "gpu-ops.secretEnvName" -}}
{{- regexReplaceAll "[^A-Z0-9_]" (printf "GPU_OPS_SECRET_%s_%s" (index . 0) (index . 1) | upper) "_" -}}
{{- end -}}

{{/*
Every secret the configuration references, as a list of
{name: ENV_VAR, secretName: ..., key: ...}, plus the rewritten channels (secretKeyRef ->
{env: ENV_VAR}). Returned as YAML: {env: [...], channels: {...}}.
Channel fields looked at: every top-level field, and smtp.password.
*/}}
{{- define "gpu-ops.secrets" -}}
{{- $env := list -}}
{{- $channels := dict -}}
{{- if .Values.storage.existingSecret.name -}}
{{- $env = append $env (dict "name" "GPU_OPS_STORAGE_URL" "secretName" .Values.storage.existingSecret.name "key" .Values.storage.existingSecret.key) -}}
{{- end -}}
{{- range $chName, $ch := (.Values.config.channels | default (dict)) -}}
{{- $out := dict -}}
{{- range $field, $value := $ch -}}
{{- if and (kindIs "map" $value) (hasKey $value "secretKeyRef") -}}
{{- $var := include "gpu-ops.secretEnvName" (list $chName $field) -}}
{{- $env = append $env (dict "name" $var "secretName" $value.secretKeyRef.name "key" $value.secretKeyRef.key) -}}
{{- $_ := set $out $field (dict "env" $var) -}}
{{- else if and (eq $field "smtp") (kindIs "map" $value) -}}
{{- $smtp := deepCopy $value -}}
{{- if and (kindIs "map" $value.password) (hasKey $value.password "secretKeyRef") -}}
{{- $var := include "gpu-ops.secretEnvName" (list $chName "smtp_password") -}}
{{- $env = append $env (dict "name" $var "secretName" $value.password.secretKeyRef.name "key" $value.password.secretKeyRef.key) -}}
{{- $_ := set $smtp "password" (dict "env" $var) -}}
{{- end -}}
{{- $_ := set $out $field $smtp -}}
{{- else -}}
{{- $_ := set $out $field $value -}}
{{- end -}}
{{- end -}}
{{- $_ := set $channels $chName $out -}}
{{- end -}}
{{- toYaml (dict "env" $env "channels" $channels) -}}
{{- end -}}

{{/* The GPU_OPS_CONFIG file the ConfigMap holds. */}}
{{- define "gpu-ops.configFile" -}}
{{- $secrets := include "gpu-ops.secrets" . | fromYaml -}}
{{- $cfg := deepCopy .Values.config -}}
{{- if not $cfg.prices -}}
{{- $_ := set $cfg "prices" (deepCopy .Values.defaultPrices) -}}
{{- end -}}
{{- if .Values.storage.existingSecret.name -}}
{{- $_ := set $cfg "storage" (dict "url" (dict "env" "GPU_OPS_STORAGE_URL")) -}}
{{- else -}}
{{- $_ := set $cfg "storage" (dict "url" (required "storage: set storage.existingSecret.name (a Secret holding the database URL) or storage.url" .Values.storage.url)) -}}
{{- end -}}
{{- if .Values.config.channels -}}
{{- $_ := set $cfg "channels" $secrets.channels -}}
{{- end -}}
{{- if .Values.priorityClass.create -}}
{{- $compute := default (dict) $cfg.compute -}}
{{- if not $compute.priority_class -}}
{{- $_ := set $compute "priority_class" .Values.priorityClass.name -}}
{{- end -}}
{{- $_ := set $cfg "compute" $compute -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
Namespaces where gpu_ops reads pods, pod logs and events: the compute namespace, every
namespace a kubernetes usage source names, and rbac.extraNamespaces. Returned as YAML:
{namespaces: [...], clusterWide: bool}; clusterWide when a kubernetes source has no
namespace list (it collects from all namespaces).
*/}}
{{- define "gpu-ops.podReadScope" -}}
{{- $ns := list (default "default" (.Values.config.compute | default (dict)).namespace) -}}
{{- $clusterWide := false -}}
{{- range $src := ((.Values.config.usage | default (dict)).sources | default (list)) -}}
{{- if eq $src.type "kubernetes" -}}
{{- if $src.namespaces -}}
{{- $ns = concat $ns $src.namespaces -}}
{{- else -}}
{{- $clusterWide = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $ns = concat $ns .Values.rbac.extraNamespaces | uniq -}}
{{- toYaml (dict "namespaces" $ns "clusterWide" $clusterWide) -}}
{{- end -}}

{{/* Container env for secrets: valueFrom secretKeyRef on existing Secrets. */}}
{{- define "gpu-ops.secretEnv" -}}
{{- $secrets := include "gpu-ops.secrets" . | fromYaml -}}
{{- range $secrets.env }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName | quote }}
      key: {{ .key | quote }}
{{- end }}
{{- end -}}

{{/* Plain env shared by the code server and the run workers it launches. */}}
{{- define "gpu-ops.plainEnv" -}}
GPU_OPS_CONFIG: /etc/gpu-ops/gpu_ops.yaml
GPU_OPS_HOME: /var/lib/gpu-ops
HOME: /tmp
KT_INSTALL_NAMESPACE: {{ .Values.kubetorch.namespace }}
PYTHONDONTWRITEBYTECODE: "1"
PYTHONUNBUFFERED: "1"
{{- end -}}

{{- define "gpu-ops.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}
