{{/*
Names, labels, the image reference, and the frontend table.
*/}}

{{- define "polymq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* release-chart, or the release name alone when it already holds the chart name */}}
{{- define "polymq.fullname" -}}
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

{{/*
The name of one component's objects: (dict "root" $ "component" "http").
At most 52 characters, so that a StatefulSet's pod names and revision-hash labels fit in 63.
*/}}
{{- define "polymq.componentName" -}}
{{- printf "%s-%s" (include "polymq.fullname" .root | trunc 40 | trimSuffix "-") .component | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "polymq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object: (dict "root" $ "component" "core") */}}
{{- define "polymq.labels" -}}
helm.sh/chart: {{ include "polymq.chart" .root }}
{{ include "polymq.selectorLabels" . }}
app.kubernetes.io/part-of: polymq
{{- with .root.Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* What a component's selector matches: (dict "root" $ "component" "core") */}}
{{- define "polymq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "polymq.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/* metadata.annotations (commonAnnotations merged with the object's own), indented for a
     top-level object, or nothing. Called with a left-trimming include: (dict "root" $ "annotations" map) */}}
{{- define "polymq.annotations" -}}
{{- $all := merge (dict) (.annotations | default dict) (.root.Values.commonAnnotations | default dict) }}
{{- with $all }}
{{- toYaml (dict "annotations" .) | nindent 2 }}
{{- end }}
{{- end }}

{{- define "polymq.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "polymq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "polymq.componentName" (dict "root" . "component" "core")) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* HOST:PORT of the core that frontends connect to: this release's, or externalCore.
     This release's is its headless Service, whose name resolves to every core pod: a
     frontend's core link tries them in turn and moves to another when its pod goes */}}
{{- define "polymq.coreAddress" -}}
{{- if .Values.core.enabled }}
{{- printf "%s:%d" (include "polymq.componentName" (dict "root" . "component" "core-headless")) (int .Values.core.containerPorts.wire) }}
{{- else }}
{{- printf "%s:%d" .Values.externalCore.host (int .Values.externalCore.port) }}
{{- end }}
{{- end }}

{{/*
The frontend table: every protocol frontend the chart knows, keyed by its values block.
Adding a frontend = a values block (and its values.schema.json entry) + an entry here; the
shared templates under templates/frontend/ render its Deployment, Service, PDB, HPA and Ingress.

  command    the `polymq <command>` sub-command
  title      what NOTES.txt calls it
  tls        the service takes --tls-cert/--tls-key (a `tls` block in its values; the global
             `tls` block turns it on too)
  ingress    it has an HTTP listener worth an Ingress (an `ingress` block in its values)
  listeners  one per port: `name` (its key in containerPorts, service.ports and nodePorts, and
             its container and Service port name), `flag` (the CLI flag that sets it),
             `web: true` for the one HTTP listener that serves /healthz, /readyz and
             /metrics (probes, scraping and the Ingress use it), `scheme` the URL scheme
             clients use, `tls: true` when the listener speaks TLS once the frontend's TLS is
             on, `tlsOnly: true` when it exists only then, `tlsPort` its port name once it
             speaks TLS (an HTTP listener becomes `https`: the name says the protocol to
             meshes and Ingress controllers, and a ServiceMonitor endpoint, which selects
             ports by name, scrapes every `https` port with TLS and every `http` one without)
*/}}
{{- define "polymq.frontendTable" -}}
http:
  command: http
  title: JSON over HTTP
  tls: true
  ingress: true
  listeners:
    - {name: http, flag: --http-port, web: true, scheme: http, tls: true, tlsPort: https}
longpoll:
  command: longpoll
  title: long polling and SSE
  tls: true
  ingress: true
  listeners:
    - {name: http, flag: --longpoll-port, web: true, scheme: http, tls: true, tlsPort: https}
stomp:
  command: stomp
  title: STOMP over TCP and WebSocket
  tls: true
  ingress: true
  listeners:
    - {name: stomp, flag: --stomp-port, web: false, scheme: stomp, tls: true}
    - {name: ws, flag: --stomp-ws-port, web: true, scheme: ws, tls: true}
avro:
  command: avro
  title: Avro over HTTP
  tls: true
  ingress: true
  listeners:
    - {name: http, flag: --avro-port, web: true, scheme: http, tls: true, tlsPort: https}
amqp:
  command: amqp
  title: AMQP 0-9-1
  tls: true
  ingress: false
  listeners:
    - {name: amqp, flag: --amqp-port, web: false, scheme: amqp}
    - {name: amqps, flag: --amqp-tls-port, web: false, scheme: amqps, tls: true, tlsOnly: true}
    - {name: http, flag: --amqp-admin-port, web: true, scheme: http}
{{- end }}

{{/*
A frontend's listeners as they are deployed, as a YAML list: (dict "root" $ "name" "stomp").
Those that exist only with TLS are left out without it; `secure` says whether one speaks TLS,
and `scheme` becomes its TLS form (https, wss, stomp+ssl) then; `port` is its container and
Service port name (`tlsPort` when secure, else `name`), `name` its key in the values.
*/}}
{{- define "polymq.listeners" -}}
{{- $fe := index (include "polymq.frontendTable" .root | fromYaml) .name }}
{{- $tls := include "polymq.frontendTLS" . }}
{{- $secureScheme := dict "http" "https" "ws" "wss" "stomp" "stomp+ssl" "amqp" "amqps" "amqps" "amqps" }}
{{- $out := list }}
{{- range $fe.listeners }}
{{- if or (not .tlsOnly) $tls }}
{{- $secure := and $tls .tls | default false }}
{{- $scheme := ternary (get $secureScheme .scheme) .scheme (eq (toString $secure) "true") }}
{{- $port := ternary (.tlsPort | default .name) .name (eq (toString $secure) "true") }}
{{- $out = append $out (dict "name" .name "port" $port "flag" .flag "web" (.web | default false) "scheme" $scheme "secure" $secure) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* The names of the enabled frontends, comma-separated (empty when none) */}}
{{- define "polymq.enabledFrontends" -}}
{{- $names := list }}
{{- range $name, $fe := include "polymq.frontendTable" . | fromYaml }}
{{- if (index $.Values $name).enabled }}
{{- $names = append $names $name }}
{{- end }}
{{- end }}
{{- join "," $names }}
{{- end }}

{{/* Whether a frontend serves TLS: (dict "root" $ "name" "stomp") -> "true" or "".
     Its own <name>.tls.enabled, or the global tls.enabled (every frontend that can). */}}
{{- define "polymq.frontendTLS" -}}
{{- $fe := index (include "polymq.frontendTable" .root | fromYaml) .name }}
{{- $values := index .root.Values .name }}
{{- if and $fe.tls (or .root.Values.tls.enabled (and $values.tls $values.tls.enabled)) }}true{{ end }}
{{- end }}

{{/* Where a frontend's certificate and key come from, as YAML {secret, certKey, keyKey}:
     its own <name>.tls.existingSecret (with its certKey/keyKey), else the global
     tls.existingSecret (with the global keys); secret is "" when neither is set.
     (dict "root" $ "name" "http") */}}
{{- define "polymq.tlsSecret" -}}
{{- $own := (index .root.Values .name).tls | default dict }}
{{- $global := .root.Values.tls }}
{{- if $own.existingSecret }}
{{- toYaml (dict "secret" $own.existingSecret "certKey" ($own.certKey | default "tls.crt") "keyKey" ($own.keyKey | default "tls.key")) }}
{{- else }}
{{- toYaml (dict "secret" ($global.existingSecret | default "") "certKey" ($global.certKey | default "tls.crt") "keyKey" ($global.keyKey | default "tls.key")) }}
{{- end }}
{{- end }}

{{/* The port name of the listener that serves /healthz, /readyz and /metrics (`https` once
     an HTTP listener speaks TLS): (dict "root" $ "name" "stomp") */}}
{{- define "polymq.webListener" -}}
{{- range include "polymq.listeners" . | fromYamlArray }}
{{- if .web }}{{ .port }}{{ end }}
{{- end }}
{{- end }}

{{/* The core pods' affinity: core.affinity when set, else core.podAntiAffinityPreset: soft
     (preferred) or hard (required) spreading of the core pods over hosts, or none. */}}
{{- define "polymq.coreAffinity" -}}
{{- $v := .Values.core }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "polymq.selectorLabels" (dict "root" . "component" "core") | fromYaml)) }}
{{- if $v.affinity }}
{{- toYaml $v.affinity }}
{{- else if eq $v.podAntiAffinityPreset "soft" }}
{{- toYaml (dict "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term)))) }}
{{- else if eq $v.podAntiAffinityPreset "hard" }}
{{- toYaml (dict "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term))) }}
{{- end }}
{{- end }}

{{/* Where the bridge's links file and RabbitMQ URL come from, as YAML {configMap, linksKey,
     secret, urlKey, chartConfigMap, chartSecret}: bridge.existingConfigMap (its
     bridge.linksKey), else the ConfigMap the chart renders from bridge.links (links.json);
     bridge.rabbitmq.existingSecret, else the Secret the chart makes from bridge.rabbitmq.url,
     both under bridge.rabbitmq.key. */}}
{{- define "polymq.bridgeSources" -}}
{{- $v := .Values.bridge }}
{{- $own := include "polymq.componentName" (dict "root" . "component" "bridge") }}
configMap: {{ $v.existingConfigMap | default $own | quote }}
linksKey: {{ ternary $v.linksKey "links.json" (ne $v.existingConfigMap "") | quote }}
chartConfigMap: {{ not $v.existingConfigMap }}
secret: {{ $v.rabbitmq.existingSecret | default $own | quote }}
urlKey: {{ $v.rabbitmq.key | quote }}
chartSecret: {{ not $v.rabbitmq.existingSecret }}
{{- end }}

{{/* The links file the chart renders from bridge.links */}}
{{- define "polymq.bridgeLinksFile" -}}
{{- toPrettyJson (dict "links" .Values.bridge.links) }}
{{- end }}

{{/*
The bytes of a Kubernetes memory quantity: "512Mi", "2G", "1073741824"; "" when it has another
form ("1.5Gi", "512m"): its callers then say so.
*/}}
{{- define "polymq.bytes" -}}
{{- $q := toString . -}}
{{- $n := regexFind "^[0-9]+" $q -}}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- $unit := substr (len $n) (len $q) $q -}}
{{- if and $n (hasKey $units $unit) -}}
{{- mul (atoi $n) (get $units $unit) -}}
{{- end -}}
{{- end }}

{{/*
nats-server's soft memory limit (its GOMEMLIMIT: POLYMQ_NATS_MEMORY_LIMIT), in bytes, for a
core pod: core.nats.memoryLimit when set (0: none); else, with the NATS sidecar, 90% of that
container's memory limit (a Go process given its hard limit as its soft limit is killed
before it collects); else "" (polymq's own default, 512 MiB: the core container's limit is
shared with the core, so it is for the operator to choose). "invalid" when a quantity cannot
be read.
*/}}
{{- define "polymq.natsMemoryLimit" -}}
{{- $nats := .Values.core.nats -}}
{{- $m := $nats.memoryLimit -}}
{{- $set := "" -}}
{{- if or (kindIs "float64" $m) (kindIs "int" $m) (kindIs "int64" $m) -}}
{{- $set = printf "%d" (int64 $m) -}}
{{- else if not (kindIs "invalid" $m) -}}
{{- $set = toString $m -}}
{{- end -}}
{{- if ne $set "" -}}
{{- include "polymq.bytes" $set | default "invalid" -}}
{{- else if $nats.sidecar -}}
{{- $limit := dig "limits" "memory" "" ($nats.resources | default dict) | toString -}}
{{- if $limit -}}
{{- $bytes := include "polymq.bytes" $limit -}}
{{- if $bytes -}}{{- div (mul (atoi $bytes) 9) 10 -}}{{- else -}}invalid{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}
