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
Channel fields looked at: every top-level field, smtp.password and each of headers;
storage.password becomes GPU_OPS_DB_PASSWORD.
*/}}
{{- define "gpu-ops.secrets" -}}
{{- $env := list -}}
{{- $channels := dict -}}
{{- if .Values.storage.existingSecret.name -}}
{{- $env = append $env (dict "name" "GPU_OPS_STORAGE_URL" "secretName" .Values.storage.existingSecret.name "key" .Values.storage.existingSecret.key) -}}
{{- else if .Values.storage.password -}}
{{- $env = append $env (dict "name" "GPU_OPS_DB_PASSWORD" "secretName" .Values.storage.password.secretKeyRef.name "key" .Values.storage.password.secretKeyRef.key) -}}
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
{{- else if and (eq $field "headers") (kindIs "map" $value) -}}
{{- $headers := dict -}}
{{- range $header, $hv := $value -}}
{{- if and (kindIs "map" $hv) (hasKey $hv "secretKeyRef") -}}
{{- $var := include "gpu-ops.secretEnvName" (list $chName (printf "header_%s" $header)) -}}
{{- $env = append $env (dict "name" $var "secretName" $hv.secretKeyRef.name "key" $hv.secretKeyRef.key) -}}
{{- $_ := set $headers $header (dict "env" $var) -}}
{{- else -}}
{{- $_ := set $headers $header $hv -}}
{{- end -}}
{{- end -}}
{{- $_ := set $out $field $headers -}}
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
{{- $storage := dict -}}
{{- if .Values.storage.existingSecret.name -}}
{{- $_ := set $storage "url" (dict "env" "GPU_OPS_STORAGE_URL") -}}
{{- else -}}
{{- $_ := set $storage "url" (required "storage: set storage.existingSecret.name (a Secret holding the database URL) or storage.url" .Values.storage.url) -}}
{{- if .Values.storage.password -}}
{{- $_ := set $storage "password" (dict "env" "GPU_OPS_DB_PASSWORD") -}}
{{- end -}}
{{- end -}}
{{- with .Values.storage.connectTimeoutSeconds -}}
{{- $_ := set $storage "connect_timeout_s" . -}}
{{- end -}}
{{- with .Values.storage.statementTimeoutSeconds -}}
{{- $_ := set $storage "statement_timeout_s" . -}}
{{- end -}}
{{- $_ := set $cfg "storage" $storage -}}
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

{{/*
NetworkPolicy egress shared by the code server and the run workers: DNS, the database, the API server,
the Kubetorch controller, the alert channels; `to: []` in values means any address on
those ports.
*/}}
{{- define "gpu-ops.egressPort" -}}
{{- range $p := . }}
- port: {{ $p }}
  protocol: TCP
{{- end }}
{{- end -}}
{{- define "gpu-ops.egressRules" -}}
{{- $np := .Values.networkPolicy -}}
# DNS
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ $np.egress.dns.namespace }}
      podSelector:
        matchLabels:
          {{- toYaml $np.egress.dns.podLabels | nindent 10 }}
  ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
{{- range $name := list "database" "apiServer" "channels" }}
{{- $rule := index $np.egress $name }}
# {{ $name }}
- ports:
    {{- include "gpu-ops.egressPort" $rule.ports | trim | nindent 4 }}
  {{- with $rule.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
# the Kubetorch controller
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Values.kubetorch.namespace }}
  ports:
    - port: {{ $np.egress.kubetorchControllerPort }}
      protocol: TCP
{{- with $np.egress.extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The namespace training workers run in (config.compute.namespace). */}}
{{- define "gpu-ops.computeNamespace" -}}
{{- default "default" (.Values.config.compute | default (dict)).namespace -}}
{{- end -}}

{{/* The exporter's pods: not the code server's selector labels (its Service must not route here). */}}
{{- define "gpu-ops.exporterSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-ops.name" . }}-exporter
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
