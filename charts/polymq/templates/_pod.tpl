{{/*
The pod spec every polymq workload shares (the core's StatefulSet and each frontend's
Deployment): one container running `polymq <command>`, the security contexts, /tmp on an
emptyDir (the root filesystem is read-only), scheduling, and probes on the HTTP listener.

  (dict "root" $                 the chart context
        "component" "http"       container name and the component label
        "values" .Values.http    the component's values block
        "args" (list ...)        the container's arguments after `polymq`
        "ports" (list (dict "name" "http" "port" 7480) ...)
        "probePort" "http"       the port name serving /healthz and /readyz
        "probeScheme" "HTTP"     HTTPS where that listener has TLS
        "env" (list ...)         environment variables (EnvVar objects)
        "volumes" (list ...)     extra volumes, "mounts" (list ...) their mounts
        "serviceAccount" true    run as the chart's service account with its token (the core)
        "affinity" (dict ...)    instead of the values' own affinity (optional)
        "lifecycle" (dict ...)   the container's lifecycle hooks (optional)
        "initContainers" (list)  Container objects as they are, e.g. a native sidecar (optional))
*/}}
{{- define "polymq.podSpec" -}}
{{- $root := .root }}
{{- $v := .values }}
{{- if .serviceAccount }}
serviceAccountName: {{ include "polymq.serviceAccountName" $root }}
automountServiceAccountToken: {{ $root.Values.serviceAccount.automountServiceAccountToken }}
{{- else }}
automountServiceAccountToken: false
{{- end }}
{{- /* Service links would put POLYMQ_CORE_PORT=tcp://... in the environment of a release named
       "polymq", and the services read POLYMQ_* variables as settings. */}}
enableServiceLinks: false
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.affinity | default $v.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .initContainers }}
initContainers:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: {{ .component }}
    image: {{ include "polymq.image" $root | quote }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command: ["polymq"]
    args:
      {{- toYaml .args | nindent 6 }}
    {{- $env := concat (.env | default list) ($v.extraEnv | default list) }}
    {{- with $env }}
    env:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    ports:
      {{- range .ports }}
      - name: {{ .name }}
        containerPort: {{ .port }}
        protocol: TCP
      {{- end }}
    {{- $probe := dict "port" .probePort "scheme" (.probeScheme | default "HTTP") }}
    {{- if and $v.startupProbe $v.startupProbe.enabled }}
    startupProbe:
      {{- include "polymq.probe" (merge (dict "probe" $v.startupProbe "path" "/healthz") $probe) | nindent 6 }}
    {{- end }}
    {{- if $v.livenessProbe.enabled }}
    livenessProbe:
      {{- include "polymq.probe" (merge (dict "probe" $v.livenessProbe "path" "/healthz") $probe) | nindent 6 }}
    {{- end }}
    {{- if $v.readinessProbe.enabled }}
    readinessProbe:
      {{- include "polymq.probe" (merge (dict "probe" $v.readinessProbe "path" "/readyz") $probe) | nindent 6 }}
    {{- end }}
    {{- with .lifecycle }}
    lifecycle:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $v.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    securityContext:
      {{- toYaml $root.Values.containerSecurityContext | nindent 6 }}
    volumeMounts:
      - name: tmp
        mountPath: /tmp
      {{- with .mounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: {{ $root.Values.tmpSizeLimit }}
  {{- with .volumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* An HTTP probe: (dict "probe" $values "path" "/healthz" "port" "http" "scheme" "HTTP") */}}
{{- define "polymq.probe" -}}
httpGet:
  path: {{ .path }}
  port: {{ .port }}
  scheme: {{ .scheme }}
{{- range $key, $value := omit .probe "enabled" }}
{{ $key }}: {{ $value }}
{{- end }}
{{- end }}

{{/* The pod template's annotations: the component's own and, when Prometheus finds pods by
     annotation (metrics on, no ServiceMonitor), the prometheus.io/* ones.
     (dict "root" $ "values" $v "port" 7480 "scheme" "http") */}}
{{- define "polymq.podAnnotations" -}}
{{- $all := dict }}
{{- if and .root.Values.metrics.enabled (not .root.Values.metrics.serviceMonitor.enabled) }}
{{- $_ := set $all "prometheus.io/scrape" "true" }}
{{- $_ := set $all "prometheus.io/port" (toString .port) }}
{{- $_ := set $all "prometheus.io/path" "/metrics" }}
{{- $_ := set $all "prometheus.io/scheme" .scheme }}
{{- end }}
{{- $all = merge (dict) (.values.podAnnotations | default dict) $all }}
{{- with $all }}
{{- toYaml (dict "annotations" .) | nindent 6 }}
{{- end }}
{{- end }}

{{/* Volumes and mounts for logins: the users.json of auth.existingSecret */}}
{{- define "polymq.authVolume" -}}
- name: auth
  secret:
    secretName: {{ .Values.auth.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.auth.usersKey }}
        path: users.json
{{- end }}

{{/* The environment a frontend logs in to the core with, from auth.frontendLogin */}}
{{- define "polymq.frontendLoginEnv" -}}
{{- $login := .Values.auth.frontendLogin }}
{{- if $login.existingSecret }}
{{- if eq $login.type "token" }}
- name: POLYMQ_CORE_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $login.existingSecret }}
      key: {{ $login.tokenKey }}
{{- else }}
- name: POLYMQ_CORE_USER
  valueFrom:
    secretKeyRef:
      name: {{ $login.existingSecret }}
      key: {{ $login.userKey }}
- name: POLYMQ_CORE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $login.existingSecret }}
      key: {{ $login.passwordKey }}
{{- end }}
{{- end }}
{{- end }}
