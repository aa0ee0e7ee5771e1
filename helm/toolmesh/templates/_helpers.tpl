{{/* Chart name, release-scoped full name and labels. */}}
{{- define "toolmesh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "toolmesh.fullname" -}}
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

{{- define "toolmesh.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Labels of a component; call with (dict "root" $ "c" $component). */}}
{{- define "toolmesh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toolmesh.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .c.role }}
toolmesh.io/deployment: {{ .c.name }}
{{- end }}

{{- define "toolmesh.labels" -}}
{{ include "toolmesh.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: toolmesh
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels of objects shared by the release (ConfigMaps of configs, the setup Job). */}}
{{- define "toolmesh.commonLabels" -}}
app.kubernetes.io/name: {{ include "toolmesh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: toolmesh
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
Every Deployment the chart renders, as a list of components: role, name (the Deployment's name
suffix), values (that part of the values file) and the command. Templates iterate this list so
all roles share one Deployment, PDB and autoscaler template.
*/}}
{{- define "toolmesh.components" -}}
{{- $fullname := include "toolmesh.fullname" . }}
{{- $list := list }}
{{- if .Values.resolver.enabled }}
{{- $list = append $list (dict "role" "resolver" "name" "resolver" "fullname" (printf "%s-resolver" $fullname) "v" .Values.resolver "command" (list "serve" "resolver")) }}
{{- end }}
{{- if .Values.schemaExpander.enabled }}
{{- $list = append $list (dict "role" "schema-expander" "name" "schema-expander" "fullname" (printf "%s-schema-expander" $fullname) "v" .Values.schemaExpander "command" (list "serve" "schema-expander")) }}
{{- end }}
{{- $seen := dict }}
{{- range .Values.executors }}
{{- if ne (toString .enabled) "false" }}
{{- $n := printf "executor-%s" .name }}
{{- if hasKey $seen $n }}{{ fail (printf "executors: the name %q is used twice; every executor deployment needs its own name" .name) }}{{ end }}
{{- $_ := set $seen $n true }}
{{- $list = append $list (dict "role" "executor" "name" $n "fullname" (printf "%s-%s" $fullname $n | trunc 63 | trimSuffix "-") "v" . "command" (list "serve" "executor")) }}
{{- end }}
{{- end }}
{{- range .Values.mcpBridges }}
{{- if .enabled }}
{{- $n := printf "mcp-bridge-%s" .name }}
{{- if hasKey $seen $n }}{{ fail (printf "mcpBridges: the name %q is used twice; every bridge deployment needs its own name" .name) }}{{ end }}
{{- $_ := set $seen $n true }}
{{- $list = append $list (dict "role" "mcp-bridge" "name" $n "fullname" (printf "%s-%s" $fullname $n | trunc 63 | trimSuffix "-") "v" . "command" (list "serve" "mcp-bridge")) }}
{{- end }}
{{- end }}
{{- toJson $list }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the shutdown grace and force times rounded up to seconds, plus
slack, so Kubernetes kills no service before it has given up on its handlers by itself.
*/}}
{{- define "toolmesh.terminationGrace" -}}
{{- $ms := add (int64 (default .root.Values.shutdownGraceMs .c.v.shutdownGraceMs)) (int64 .root.Values.shutdownForceMs) }}
{{- add (div (add $ms 999) 1000) (int64 .root.Values.terminationExtraSeconds) }}
{{- end }}

{{/*
The work consumer of a tool: `work_` + the subject token of its name (docs/protocol.md#tokens).
Names of letters, digits, `_`, `-`, `.`, `=`, space, `/`, `*`, `:`, `@` and `+` are mapped here;
others must be listed as consumers.
*/}}
{{- define "toolmesh.toolToken" -}}
{{- $name := . }}
{{- if regexMatch "^[A-Za-z0-9_-]{1,64}$" $name }}
{{- $name }}
{{- else }}
{{- $t := $name | replace "=" "=3d" | replace "." "=2e" | replace " " "=20" | replace "/" "=2f" | replace "*" "=2a" | replace ":" "=3a" | replace "@" "=40" | replace "+" "=2b" }}
{{- if not (regexMatch "^[A-Za-z0-9_=-]+$" $t) }}
{{- fail (printf "autoscaling.keda.tools: the chart cannot derive the consumer name of tool %q; list `work_<token>` (docs/protocol.md#tokens) under autoscaling.keda.consumers instead" $name) }}
{{- end }}
{{- if le (len $t) 64 }}
{{- $t }}
{{- else }}
{{- printf "%s==%s" (substr 0 38 $t) (substr 0 24 (sha256sum $name)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Environment variables of NATS authentication; call with the auth dict. */}}
{{- define "toolmesh.natsAuthEnv" -}}
{{- if eq .type "creds" }}
- name: NATS_CREDS
  value: /etc/toolmesh/nats/{{ .credsKey }}
{{- else if eq .type "nkey" }}
- name: NATS_NKEY
  value: /etc/toolmesh/nats/{{ .nkeyKey }}
{{- else if eq .type "token" }}
- name: NATS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .tokenKey }}
{{- else if eq .type "userPassword" }}
- name: NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .userKey }}
- name: NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .passwordKey }}
{{- end }}
{{- end }}

{{/* Fails when the auth dict needs a Secret and names none; `where` says which value. */}}
{{- define "toolmesh.checkAuth" -}}
{{- if and (ne .auth.type "none") (not .auth.existingSecret) }}
{{- fail (printf "%s.type is %s, so %s.existingSecret must name the Secret that holds the credentials" .where .auth.type .where) }}
{{- end }}
{{- end }}
