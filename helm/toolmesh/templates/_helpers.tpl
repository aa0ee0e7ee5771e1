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
{{- include "toolmesh.imageRef" (dict "img" .Values.image "root" .) }}
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
suffix), fullname, values (that part of the values file) and the command. Templates iterate this
list so all roles share one Deployment, PDB and autoscaler template. A name longer than
Kubernetes allows is refused rather than truncated, since truncation makes two deployments of
a long release name collide.
*/}}
{{- define "toolmesh.components" -}}
{{- $fullname := include "toolmesh.fullname" . }}
{{- $list := list }}
{{- if .Values.resolver.enabled }}
{{- $list = append $list (dict "role" "resolver" "name" "resolver" "v" .Values.resolver "command" (list "serve" "resolver")) }}
{{- end }}
{{- if .Values.schemaExpander.enabled }}
{{- $list = append $list (dict "role" "schema-expander" "name" "schema-expander" "v" .Values.schemaExpander "command" (list "serve" "schema-expander")) }}
{{- end }}
{{- if .Values.gateway.enabled }}
{{- $list = append $list (dict "role" "gateway" "name" "gateway" "v" .Values.gateway "command" (list "serve" "gateway")) }}
{{- end }}
{{- $seen := dict }}
{{- range $i, $e := .Values.executors }}
{{- if ne (toString $e.enabled) "false" }}
{{- $v := deepCopy $e }}
{{- if not $v.name }}
{{- if ne $i 0 }}{{ fail (printf "executors[%d]: every executor deployment but the first (named builtin by default) needs a name" $i) }}{{ end }}
{{- $_ := set $v "name" "builtin" }}
{{- end }}
{{- $n := printf "executor-%s" $v.name }}
{{- if hasKey $seen $n }}{{ fail (printf "executors: the name %q is used twice; every executor deployment needs its own name" $v.name) }}{{ end }}
{{- $_ := set $seen $n true }}
{{- $list = append $list (dict "role" "executor" "name" $n "v" $v "command" (list "serve" "executor")) }}
{{- end }}
{{- end }}
{{- range $i, $e := .Values.mcpBridges }}
{{- if $e.enabled }}
{{- if not $e.name }}{{ fail (printf "mcpBridges[%d]: every bridge deployment needs a name" $i) }}{{ end }}
{{- $n := printf "mcp-bridge-%s" $e.name }}
{{- if hasKey $seen $n }}{{ fail (printf "mcpBridges: the name %q is used twice; every bridge deployment needs its own name" $e.name) }}{{ end }}
{{- $_ := set $seen $n true }}
{{- $list = append $list (dict "role" "mcp-bridge" "name" $n "v" $e "command" (list "serve" "mcp-bridge")) }}
{{- end }}
{{- end }}
{{- $out := list }}
{{- range $c := $list }}
{{- $full := printf "%s-%s" $fullname $c.name }}
{{- $out = append $out (merge $c (dict "fullname" $full)) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The image of a component: its own `image` fields winning over the global ones. A digest pins
the image (`repository@digest`, or `repository:tag@digest` with a tag); a role naming another
repository never inherits the global tag's digest.
*/}}
{{- define "toolmesh.componentImage" -}}
{{- $own := default dict .c.v.image }}
{{- $global := deepCopy .root.Values.image }}
{{- if and $own.repository (ne $own.repository $global.repository) }}
{{- $_ := unset $global "digest" }}
{{- end }}
{{- $img := merge (deepCopy $own) $global }}
{{- include "toolmesh.imageRef" (dict "img" $img "root" .root) }}
{{- end }}

{{/* repository[:tag][@digest] of an image dict; the tag defaults to the appVersion unless a digest pins it. */}}
{{- define "toolmesh.imageRef" -}}
{{- $img := .img }}
{{- if $img.digest }}
{{- if $img.tag }}{{ printf "%s:%s@%s" $img.repository $img.tag $img.digest }}{{ else }}{{ printf "%s@%s" $img.repository $img.digest }}{{ end }}
{{- else }}
{{- printf "%s:%s" $img.repository (default .root.Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{- define "toolmesh.componentPullPolicy" -}}
{{- $img := merge (deepCopy (default dict .c.v.image)) (deepCopy .root.Values.image) }}
{{- $img.pullPolicy }}
{{- end }}

{{/* The ServiceAccount a component's pods run as, or "" for the namespace's default. */}}
{{- define "toolmesh.serviceAccountName" -}}
{{- $sa := default dict .c.v.serviceAccount }}
{{- if $sa.name }}{{ $sa.name }}{{ else if $sa.create }}{{ .c.fullname }}{{ end }}
{{- end }}

{{/*
Pod placement of a component: its own nodeSelector, tolerations, affinity and
topologySpreadConstraints replace the global ones.
*/}}
{{- define "toolmesh.placement" -}}
{{- $v := .c.v }}
{{- $g := .root.Values }}
{{- with (hasKey $v "nodeSelector" | ternary $v.nodeSelector $g.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (hasKey $v "tolerations" | ternary $v.tolerations $g.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (hasKey $v "affinity" | ternary $v.affinity $g.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (hasKey $v "topologySpreadConstraints" | ternary $v.topologySpreadConstraints (default list $g.topologySpreadConstraints)) }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
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
{{- else if eq .type "tls" }}
- name: NATS_CERT
  value: /etc/toolmesh/nats/{{ .certKey }}
- name: NATS_KEY
  value: /etc/toolmesh/nats/{{ .keyKey }}
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

{{/* The files of the nats-auth volume (creds, nkey, tls): list of keys of the Secret, or empty. */}}
{{- define "toolmesh.natsAuthFiles" -}}
{{- if eq .type "creds" }}{{ toJson (list .credsKey) }}
{{- else if eq .type "nkey" }}{{ toJson (list .nkeyKey) }}
{{- else if eq .type "tls" }}{{ toJson (list .certKey .keyKey) }}
{{- else }}[]{{ end }}
{{- end }}

{{/*
The TLS settings of a pod: its role's `natsTls` (a Secret of its own, such as the role's
cert-manager Certificate) over nats.tls; call with (dict "root" $ "tls" $v.natsTls).
*/}}
{{- define "toolmesh.natsTls" -}}
{{- toJson (merge (deepCopy (default dict .tls)) (deepCopy .root.Values.nats.tls)) }}
{{- end }}

{{/* NATS_CA (and the client certificate of nats.tls) of every pod with nats.tls set. */}}
{{- define "toolmesh.natsTlsEnv" -}}
{{- $tls := include "toolmesh.natsTls" . | fromJson }}
{{- if $tls.existingSecret }}
- name: NATS_CA
  value: /etc/toolmesh/nats-tls/{{ $tls.caKey }}
{{- if and $tls.certKey $tls.keyKey (ne .auth.type "tls") }}
- name: NATS_CERT
  value: /etc/toolmesh/nats-tls/{{ $tls.certKey }}
- name: NATS_KEY
  value: /etc/toolmesh/nats-tls/{{ $tls.keyKey }}
{{- end }}
{{- end }}
{{- end }}

{{/* The nats-auth and nats-tls volumes of a pod; call with (dict "root" $ "auth" $auth). */}}
{{- define "toolmesh.natsVolumes" -}}
{{- $files := include "toolmesh.natsAuthFiles" .auth | fromJsonArray }}
{{- if $files }}
- name: nats-auth
  secret:
    secretName: {{ .auth.existingSecret }}
    items:
      {{- range $files }}
      - key: {{ . }}
        path: {{ . }}
      {{- end }}
{{- end }}
{{- with include "toolmesh.natsTls" . | fromJson }}
{{- if .existingSecret }}
- name: nats-tls
  secret:
    secretName: {{ .existingSecret }}
    items:
      - key: {{ .caKey }}
        path: {{ .caKey }}
      {{- if and .certKey .keyKey (ne $.auth.type "tls") }}
      - key: {{ .certKey }}
        path: {{ .certKey }}
      - key: {{ .keyKey }}
        path: {{ .keyKey }}
      {{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "toolmesh.natsMounts" -}}
{{- if include "toolmesh.natsAuthFiles" .auth | fromJsonArray }}
- name: nats-auth
  mountPath: /etc/toolmesh/nats
  readOnly: true
{{- end }}
{{- if (include "toolmesh.natsTls" . | fromJson).existingSecret }}
- name: nats-tls
  mountPath: /etc/toolmesh/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{/*
The settings that shape the mesh's streams and consumers: `mesh` key → variable. The setup Job
creates the streams with them and every service checks the streams against them at start, so
they are set once, in `mesh`, and rendered into every pod and the Job alike.
*/}}
{{- define "toolmesh.meshVars" -}}
{{- toJson (dict
  "ackWaitMs" "TOOLMESH_ACK_WAIT_MS"
  "maxMessageBytes" "TOOLMESH_MAX_MESSAGE_BYTES"
  "duplicateWindowMs" "TOOLMESH_DUPLICATE_WINDOW_MS"
  "callRetentionMs" "TOOLMESH_CALL_RETENTION_MS"
  "sessionStateTtlMs" "TOOLMESH_SESSION_STATE_TTL_MS"
  "maxQueuedCalls" "TOOLMESH_MAX_QUEUED_CALLS"
  "maxQueuedCallsPerSession" "TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION"
  "maxQueuedCallsPerTenant" "TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT"
  "streamCompression" "TOOLMESH_STREAM_COMPRESSION"
  "storeBytes" "TOOLMESH_STORE_BYTES"
  "tenantStoreBytes" "TOOLMESH_TENANT_STORE_BYTES"
  "ownerStoreBytes" "TOOLMESH_OWNER_STORE_BYTES"
  "audit" "TOOLMESH_AUDIT"
  "auditRetention" "TOOLMESH_AUDIT_RETENTION"
  "maxDeadLetters" "TOOLMESH_MAX_DEAD_LETTERS") }}
{{- end }}

{{/*
Fails when `env` (a name → value map) or `extraEnv` (EnvVars) sets a mesh-shaping variable;
call with (dict "root" $ "where" "resolver" "env" $map "extraEnv" $list).
*/}}
{{- define "toolmesh.checkMeshEnv" -}}
{{- $vars := include "toolmesh.meshVars" .root | fromJson }}
{{- $_ := set $vars "streamReplicas" "TOOLMESH_STREAM_REPLICAS" }}
{{- $names := concat (keys (default dict .env)) (list) }}
{{- range (default list .extraEnv) }}{{ $names = append $names .name }}{{ end }}
{{- range $key := keys $vars | sortAlpha }}
{{- $var := get $vars $key }}
{{- if has $var $names }}
{{- $where := eq $key "streamReplicas" | ternary "setup.streamReplicas" (printf "mesh.%s" $key) }}
{{- fail (printf "%s sets %s, which shapes the mesh's streams: set %s instead, so the setup Job and every pod agree (a service whose settings differ from the streams' refuses to start)" $.where $var $where) }}
{{- end }}
{{- end }}
{{- $secrets := list "TOOLMESH_SECRET_KEYS" "TOOLMESH_TOKEN_CLIENT_SECRET" }}
{{- $plain := list }}
{{- range $var := $secrets }}{{ if hasKey (default dict $.env) $var }}{{ $plain = append $plain $var }}{{ end }}{{ end }}
{{- range (default list .extraEnv) }}{{ if and (has .name $secrets) (hasKey . "value") }}{{ $plain = append $plain .name }}{{ end }}{{ end }}
{{- range $var := $plain }}
{{- fail (printf "%s sets %s as plain text: put it in a Secret (an executor's or bridge's secretEnv, or extraEnvFrom, or extraEnv with valueFrom.secretKeyRef)" $.where $var) }}
{{- end }}
{{- end }}

{{/* The mesh settings of every pod and the setup Job (`mesh`, setup.streamReplicas). */}}
{{- define "toolmesh.meshEnv" -}}
{{- $vars := include "toolmesh.meshVars" . | fromJson }}
- name: TOOLMESH_STREAM_REPLICAS
  value: {{ .Values.setup.streamReplicas | default 1 | int | quote }}
{{- range $key := keys $vars | sortAlpha }}
{{- if hasKey $.Values.mesh $key }}
{{- $value := get $.Values.mesh $key }}
- name: {{ get $vars $key }}
  value: {{ kindIs "float64" $value | ternary (int64 $value) $value | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A probe of a component: the chart's handler and timings, then `probes.<kind>` of the values, then
of the role; call with (dict "root" $ "c" $c "kind" "liveness" "base" $dict).
*/}}
{{- define "toolmesh.probe" -}}
{{- $global := get (default dict .root.Values.probes) .kind | default dict }}
{{- $own := get (default dict .c.v.probes) .kind | default dict }}
{{- toYaml (mergeOverwrite (deepCopy .base) (deepCopy $global) (deepCopy $own)) }}
{{- end }}

{{/*
Egress rules derived from the endpoints a component calls: the OTLP endpoint (every role) and,
for the gateway, its JWKS URL, for any role, the token endpoint (TOOLMESH_TOKEN_URL), each to its port (`networkPolicy.otelPeers`/`oauthPeers`, default
any address). Returns JSON: {"rules": [...], "endpoints": [{"what", "url", "port"}]}.
*/}}
{{- define "toolmesh.endpointEgress" -}}
{{- $root := .root }}
{{- $v := .c.v }}
{{- $np := $root.Values.networkPolicy }}
{{- $env := merge (deepCopy (default dict $v.env)) (deepCopy $root.Values.env) }}
{{- $endpoints := list }}
{{- with (get $env "OTEL_EXPORTER_OTLP_ENDPOINT" | default $root.Values.otel.endpoint) }}
{{- $endpoints = append $endpoints (dict "what" "otel.endpoint" "url" (toString .) "peers" (default list $np.otelPeers)) }}
{{- end }}
{{- if eq .c.role "gateway" }}
{{- with get $env "TOOLMESH_GATEWAY_JWKS_URL" }}
{{- $endpoints = append $endpoints (dict "what" "the gateway's JWKS URL (TOOLMESH_GATEWAY_JWKS_URL)" "url" (toString .) "peers" (default list $np.oauthPeers)) }}
{{- end }}
{{- end }}
{{- with get $env "TOOLMESH_TOKEN_URL" }}
{{- $endpoints = append $endpoints (dict "what" "the token endpoint (TOOLMESH_TOKEN_URL)" "url" (toString .) "peers" (default list $np.oauthPeers)) }}
{{- end }}
{{- $rules := list }}
{{- $out := list }}
{{- range $endpoints }}
{{- $u := urlParse .url }}
{{- $port := 0 }}
{{- $hostPort := splitList ":" $u.host }}
{{- if gt (len $hostPort) 1 }}{{ $port = last $hostPort | atoi }}
{{- else if eq $u.scheme "https" }}{{ $port = 443 }}
{{- else if eq $u.scheme "http" }}{{ $port = 80 }}
{{- end }}
{{- $out = append $out (dict "what" .what "url" .url "port" $port) }}
{{- if and $port (ne (toString $np.deriveEgress) "false") }}
{{- $rule := dict "ports" (list (dict "port" $port "protocol" "TCP")) }}
{{- with .peers }}{{ $_ := set $rule "to" . }}{{ end }}
{{- $rules = append $rules $rule }}
{{- end }}
{{- end }}
{{- toJson (dict "rules" $rules "endpoints" $out) }}
{{- end }}

{{/*
Endpoints a component calls that its NetworkPolicy lets no traffic reach, as lines for NOTES:
an endpoint is reached by a derived rule, or by a rule (the role's `networkPolicy.egress`,
`extraEgress`, executors' and bridges' `toolEgress`) without ports or with its port.
*/}}
{{- define "toolmesh.unreachedEndpoints" -}}
{{- $root := .root }}
{{- $c := .c }}
{{- $np := $root.Values.networkPolicy }}
{{- $derived := include "toolmesh.endpointEgress" . | fromJson }}
{{- $rules := concat $derived.rules (default list $np.extraEgress) (dig "networkPolicy" "egress" list $c.v) }}
{{- if has $c.role (list "executor" "mcp-bridge") }}{{ $rules = concat $rules (default list $np.toolEgress) }}{{ end }}
{{- range $e := $derived.endpoints }}
{{- $reached := false }}
{{- range $r := $rules }}
{{- if not $r.ports }}{{ $reached = true }}{{ end }}
{{- range $p := (default list $r.ports) }}
{{- if eq (toString $p.port) (toString $e.port) }}{{ $reached = true }}{{ end }}
{{- end }}
{{- end }}
{{- if not $reached }}
  - {{ $c.fullname }}: {{ $e.what }} {{ $e.url }} has no egress rule{{ if not $e.port }} (no port could be read from it){{ end }}: add one under {{ $c.name }} networkPolicy.egress (or networkPolicy.extraEgress)
{{- end }}
{{- end }}
{{- end }}

{{/*
The checksum of what a component's pods read from chart-made ConfigMaps and Secrets: only that
content, so a change of replicas, resources or autoscaling restarts no pod (changes to the pod
spec itself roll the pods by themselves).
*/}}
{{- define "toolmesh.configChecksum" -}}
{{- $v := .c.v }}
{{- $mine := list (dig "tools" "files" nil $v) (dig "nativeTools" "files" nil $v) (dig "servers" "files" nil $v) (dig "secretEnv" "values" nil $v) }}
{{- $shared := list }}
{{- if has .c.role (list "resolver" "schema-expander") }}
{{- $shared = list .root.Values.configs.toolSets .root.Values.configs.agents }}
{{- end }}
{{- toJson (list $mine $shared) | sha256sum }}
{{- end }}

{{/* A container of the `helm test` pod running `toolmesh <args>`. */}}
{{- define "toolmesh.testContainer" -}}
{{- $root := .root }}
- name: {{ .name }}
  image: {{ include "toolmesh.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args: {{ toJson .args }}
  env:
    - name: NATS_URL
      value: {{ $root.Values.nats.url | quote }}
    - name: TOOLMESH_PREFIX
      value: {{ $root.Values.prefix | quote }}
    {{- with include "toolmesh.natsAuthEnv" .auth }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "toolmesh.natsTlsEnv" (dict "root" $root "auth" .auth) }}
    {{- . | nindent 4 }}
    {{- end }}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    {{- with include "toolmesh.natsMounts" (dict "root" $root "auth" .auth) }}
    {{- . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
The message for a Deployment name above 63 characters, or "". Rendering stops on it with
`fail`; `helm lint` does not stop on `fail`, so the Deployment template also writes the message
where it makes the manifest unparsable, which lint reports as an error.
*/}}
{{- define "toolmesh.nameTooLong" -}}
{{- if gt (len .fullname) 63 }}
{{- printf "the Deployment name %q is %d characters, above the 63 Kubernetes allows: shorten the release name or set fullnameOverride (or nameOverride), or the %s name" .fullname (len .fullname) .role }}
{{- end }}
{{- end }}

{{/*
nats.monitoringEndpoint as KEDA's operator, in its own namespace, can resolve it: a short Service
name (no dot) is qualified with the release's namespace.
*/}}
{{- define "toolmesh.monitoringEndpoint" -}}
{{- $endpoint := .Values.nats.monitoringEndpoint }}
{{- $host := first (splitList ":" $endpoint) }}
{{- if contains "." $host }}{{ $endpoint }}
{{- else }}{{ printf "%s.%s.svc%s" $host .Release.Namespace (trimPrefix $host $endpoint) }}
{{- end }}
{{- end }}
