{{/*
Checks the values schema cannot express, each failing with what to do about it (as bitnami's
rabbitmq chart does in templates/validation.yaml). Rendered by validation.yaml, so
`helm install`, `helm template` and `helm lint` all stop on them.
*/}}
{{- define "polymq.validateValues" -}}
{{- $messages := list -}}
{{- $messages = append $messages (include "polymq.validateValues.coreReplicas" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.natsSidecar" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.natsMemory" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.corePreStop" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.somethingEnabled" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.frontendsNeedCore" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.externalCore" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.auth" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.anonymousCluster" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.tls" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.clusterTLS" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.ingress" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.autoscaling" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.pdb" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.metrics" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.serviceMonitorTLS" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.bridgeLinks" . | trim) -}}
{{- $messages = append $messages (include "polymq.validateValues.bridgeRabbitmq" . | trim) -}}
{{- $messages = without $messages "" -}}
{{- $message := join "\n" $messages -}}
{{- if $message -}}
{{- printf "\nVALUES VALIDATION:\n%s" $message | fail -}}
{{- end -}}
{{- end -}}

{{/* A write commits on a majority of its replica set: two nodes stop writing when either is lost */}}
{{- define "polymq.validateValues.coreReplicas" -}}
{{- if and .Values.core.enabled (eq (int .Values.core.replicaCount) 2) -}}
polymq: core.replicaCount
    2 core nodes have no majority once one of them is lost (a write commits on a majority
    of its replica set), so two nodes are less available than one. Use 1 (no redundancy)
    or 3 (survives the loss of one node): --set core.replicaCount=3
{{- end -}}
{{- end -}}

{{/* The NATS sidecar is a native sidecar (an init container with restartPolicy Always) */}}
{{- define "polymq.validateValues.natsSidecar" -}}
{{- $v := .Values.core -}}
{{- if and $v.enabled (gt (int $v.replicaCount) 1) $v.nats.sidecar (not (semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version)) -}}
polymq: core.nats.sidecar
    The NATS sidecar of each core pod is a native sidecar container (an init container with
    restartPolicy: Always), which Kubernetes {{ .Capabilities.KubeVersion.Version }} does not run (1.29 or newer does).
    Run NATS as a child process of the core instead: --set core.nats.sidecar=false
{{- end -}}
{{- end -}}

{{/* nats-server's soft memory limit must be readable and not so small that it collects nonstop */}}
{{- define "polymq.validateValues.natsMemory" -}}
{{- $v := .Values.core -}}
{{- if and $v.enabled (gt (int $v.replicaCount) 1) -}}
{{- $bytes := include "polymq.natsMemoryLimit" . -}}
{{- if eq $bytes "invalid" -}}
polymq: core.nats.memoryLimit
    nats-server's soft memory limit (GOMEMLIMIT) comes from core.nats.memoryLimit or, with
    the NATS sidecar, from 90% of core.nats.resources.limits.memory; one of them is not a
    whole number of bytes with a unit of k, M, G, T, Ki, Mi, Gi or Ti (e.g. 1536Mi, not 1.5Gi).
{{- else if and $bytes (ne $bytes "0") (lt (atoi $bytes) 67108864) -}}
polymq: core.nats.memoryLimit
    nats-server's soft memory limit (GOMEMLIMIT) would be {{ $bytes }} bytes, under 64 Mi: it would
    collect garbage nonstop (polymq refuses it). Give the NATS container more memory
    (core.nats.resources.limits.memory, of which it takes 90%) or set
    core.nats.memoryLimit (0: no soft limit).
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The grace period covers the preStop pause and the handover that follows SIGTERM */}}
{{- define "polymq.validateValues.corePreStop" -}}
{{- $v := .Values.core -}}
{{- if and $v.enabled (le (int $v.terminationGracePeriodSeconds) (add (int $v.preStopSleepSeconds) 30)) -}}
polymq: core.terminationGracePeriodSeconds
    core.terminationGracePeriodSeconds={{ $v.terminationGracePeriodSeconds }} leaves the node at most {{ sub (int $v.terminationGracePeriodSeconds) (int $v.preStopSleepSeconds) }} s after the
    preStop pause ({{ $v.preStopSleepSeconds }} s) to hand its shards to the others and flush its store
    before SIGKILL. Give it more than 30 s (it may take 60):
    --set core.terminationGracePeriodSeconds={{ add (int $v.preStopSleepSeconds) 60 }}
{{- end -}}
{{- end -}}

{{- define "polymq.validateValues.somethingEnabled" -}}
{{- if and (not .Values.core.enabled) (not (include "polymq.enabledFrontends" .)) (not .Values.bridge.enabled) -}}
polymq: core.enabled
    Nothing to deploy: the core, every frontend and the bridge are disabled. Set
    core.enabled=true and enable at least one frontend (http.enabled, longpoll.enabled,
    stomp.enabled, avro.enabled, amqp.enabled).
{{- end -}}
{{- end -}}

{{- define "polymq.validateValues.frontendsNeedCore" -}}
{{- $frontends := include "polymq.enabledFrontends" . -}}
{{- if .Values.bridge.enabled }}{{ $frontends = trimPrefix "," (printf "%s,bridge" $frontends) }}{{ end -}}
{{- if and $frontends (not .Values.core.enabled) (not .Values.externalCore.host) -}}
polymq: core.enabled
    These are enabled without a core: {{ $frontends | replace "," ", " }}. With core.enabled=false and
    externalCore.host empty they have no core to connect to and never become ready. Set
    core.enabled=true, or point them at a core deployed elsewhere with
    externalCore.host=<host> (and externalCore.port, 7400 by default).
{{- end -}}
{{- end -}}

{{- define "polymq.validateValues.externalCore" -}}
{{- if and .Values.core.enabled .Values.externalCore.host -}}
polymq: externalCore.host
    externalCore.host={{ .Values.externalCore.host }} is set while core.enabled=true: the
    frontends would connect to this release's core and ignore it. Unset externalCore.host,
    or set core.enabled=false to use the external core.
{{- end -}}
{{- end -}}

{{- define "polymq.validateValues.auth" -}}
{{- if .Values.auth.enabled -}}
{{- if not .Values.auth.existingSecret -}}
polymq: auth.existingSecret
    auth.enabled=true needs the users, grants and tokens in a Secret: write users.json
    (password hashes from `python -m polymq_server.auth.provider hash-password`, tokens from
    `python -m polymq_server.auth.provider new-token`), then
      kubectl create secret generic polymq-users --from-file=users.json
    and set auth.existingSecret=polymq-users.
{{- else if and (or (include "polymq.enabledFrontends" .) .Values.bridge.enabled) (not .Values.auth.frontendLogin.existingSecret) -}}
polymq: auth.frontendLogin.existingSecret
    auth.enabled=true: the core requires logins, so the frontends (and the bridge) must log
    in too. Give
    them a user of users.json with every permission on "*" and put its login in a Secret:
      kubectl create secret generic polymq-frontend-login \
        --from-literal=user=frontend --from-literal=password=<its password>
    and set auth.frontendLogin.existingSecret=polymq-frontend-login (or type=token with a
    `token` key).
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Anonymous mode lets every client do everything: a replicated core (a production
     install, as a rule) must say that is meant */}}
{{- define "polymq.validateValues.anonymousCluster" -}}
{{- if and .Values.core.enabled (gt (int .Values.core.replicaCount) 1) (not .Values.auth.enabled) (not .Values.auth.allowAnonymousCluster) -}}
polymq: auth.enabled
    core.replicaCount={{ .Values.core.replicaCount }} with auth.enabled=false runs a replicated core in anonymous mode:
    every client that reaches a frontend or the core's wire port may read, publish, purge
    and delete everything. Require logins (users.json in a Secret, see auth.existingSecret):
      --set auth.enabled=true,auth.existingSecret=polymq-users,auth.frontendLogin.existingSecret=polymq-frontend-login
    or, for a test cluster, say that anonymous mode is meant:
      --set auth.allowAnonymousCluster=true
{{- end -}}
{{- end -}}

{{/* Every frontend with TLS on (its own tls.enabled, or the global one) has a Secret to
     take the certificate from: its own tls.existingSecret or the global one. */}}
{{- define "polymq.validateValues.tls" -}}
{{- $globalMissing := list }}
{{- range $name, $fe := include "polymq.frontendTable" . | fromYaml }}
{{- $v := index $.Values $name }}
{{- $from := include "polymq.tlsSecret" (dict "root" $ "name" $name) | fromYaml }}
{{- if and $v.enabled (include "polymq.frontendTLS" (dict "root" $ "name" $name)) (not $from.secret) }}
{{- if and $v.tls $v.tls.enabled }}
polymq: {{ $name }}.tls.existingSecret
    {{ $name }}.tls.enabled=true needs the certificate and key in a Secret:
      kubectl create secret tls polymq-{{ $name }}-tls --cert=tls.crt --key=tls.key
    and set {{ $name }}.tls.existingSecret=polymq-{{ $name }}-tls (keys tls.crt and tls.key,
    or name them with {{ $name }}.tls.certKey / {{ $name }}.tls.keyKey), or set
    tls.existingSecret for every frontend at once.
{{- else }}
{{- $globalMissing = append $globalMissing $name }}
{{- end }}
{{- end }}
{{- end }}
{{- with $globalMissing }}
polymq: tls.existingSecret
    tls.enabled=true puts every frontend listener on TLS, but these have no Secret to take
    the certificate from: {{ join ", " . }}.
    Create one (for the Services' DNS names, or the hosts clients use):
      kubectl create secret tls polymq-tls --cert=tls.crt --key=tls.key
    and set tls.existingSecret=polymq-tls (keys tls.crt and tls.key, or tls.certKey /
    tls.keyKey), or <frontend>.tls.existingSecret for each of them.
{{- end }}
{{- end -}}

{{/* TLS between the core pods takes their certificate, key and CA from a Secret */}}
{{- define "polymq.validateValues.clusterTLS" -}}
{{- $c := .Values.tls.cluster }}
{{- if and .Values.core.enabled $c.enabled (not $c.existingSecret) }}
polymq: tls.cluster.existingSecret
    tls.cluster.enabled=true needs the core pods' certificate, its key and the CA that signed
    it in a Secret (the certificate naming *.<the core's headless Service>), e.g. one that
    cert-manager keeps, or:
      kubectl create secret generic polymq-cluster-tls --from-file=tls.crt \
        --from-file=tls.key --from-file=ca.crt
    and set tls.cluster.existingSecret=polymq-cluster-tls (keys tls.crt, tls.key and ca.crt,
    or name them with tls.cluster.certKey / keyKey / caKey).
{{- end }}
{{- end -}}

{{/* A ServiceMonitor scraping an https /metrics must say how to check the certificate:
     Prometheus scrapes the pod's IP, which a certificate rarely names. */}}
{{- define "polymq.validateValues.serviceMonitorTLS" -}}
{{- $sm := .Values.metrics.serviceMonitor }}
{{- if and .Values.metrics.enabled $sm.enabled (not $sm.tlsConfig) }}
{{- $https := list }}
{{- range $name, $fe := include "polymq.frontendTable" . | fromYaml }}
{{- if and (index $.Values $name).enabled (include "polymq.frontendTLS" (dict "root" $ "name" $name)) }}
{{- range include "polymq.listeners" (dict "root" $ "name" $name) | fromYamlArray }}
{{- if and .web .secure }}{{ $https = append $https $name }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- with $https }}
polymq: metrics.serviceMonitor.tlsConfig
    These serve /metrics over https (on their TLS listener): {{ join ", " . }}.
    Prometheus scrapes pod IPs, which the certificate does not name: tell it how to check
    the certificate, e.g.
      metrics.serviceMonitor.tlsConfig: {ca: {secret: {name: polymq-ca, key: ca.crt}},
                                          serverName: <a DNS name in the certificate>}
    or, to encrypt without checking, metrics.serviceMonitor.tlsConfig.insecureSkipVerify=true.
{{- end }}
{{- end }}
{{- end -}}

{{- define "polymq.validateValues.ingress" -}}
{{- range $name, $fe := include "polymq.frontendTable" . | fromYaml }}
{{- $v := index $.Values $name }}
{{- if and $v.enabled $fe.ingress $v.ingress.enabled }}
{{- if not $v.ingress.hosts }}
polymq: {{ $name }}.ingress.hosts
    {{ $name }}.ingress.enabled=true with no hosts routes nothing. Add one:
      --set {{ $name }}.ingress.hosts[0].host={{ $name }}.example.com
{{- end }}
{{- range $i, $tls := $v.ingress.tls }}
{{- if not $tls.secretName }}
polymq: {{ $name }}.ingress.tls[{{ $i }}].secretName
    Ingress TLS needs the Secret holding the certificate of {{ join ", " ($tls.hosts | default list) }}:
      kubectl create secret tls polymq-{{ $name }}-ingress-tls --cert=tls.crt --key=tls.key
    and set {{ $name }}.ingress.tls[{{ $i }}].secretName=polymq-{{ $name }}-ingress-tls (or let
    cert-manager make it through an annotation, still naming it here).
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "polymq.validateValues.autoscaling" -}}
{{- range $name, $fe := include "polymq.frontendTable" . | fromYaml }}
{{- $v := index $.Values $name }}
{{- if and $v.enabled $v.autoscaling.enabled }}
{{- $as := $v.autoscaling }}
{{- if gt (int $as.minReplicas) (int $as.maxReplicas) }}
polymq: {{ $name }}.autoscaling.minReplicas
    {{ $name }}.autoscaling.minReplicas={{ $as.minReplicas }} is above maxReplicas={{ $as.maxReplicas }}.
    Raise {{ $name }}.autoscaling.maxReplicas or lower minReplicas.
{{- end }}
{{- if not (or $as.targetCPUUtilizationPercentage $as.targetMemoryUtilizationPercentage) }}
polymq: {{ $name }}.autoscaling.targetCPUUtilizationPercentage
    {{ $name }}.autoscaling.enabled=true with neither a CPU nor a memory target gives the
    autoscaler nothing to scale on. Set {{ $name }}.autoscaling.targetCPUUtilizationPercentage
    (e.g. 75) and/or targetMemoryUtilizationPercentage.
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "polymq.validateValues.pdb" -}}
{{- $pdbs := dict }}
{{- if .Values.core.enabled }}{{ $_ := set $pdbs "core" .Values.core }}{{ end }}
{{- range $name, $fe := include "polymq.frontendTable" . | fromYaml }}
{{- if (index $.Values $name).enabled }}{{ $_ := set $pdbs $name (index $.Values $name) }}{{ end }}
{{- end }}
{{- range $name, $v := $pdbs }}
{{- $pdb := $v.pdb }}
{{- if $pdb.enabled }}
{{- if and $pdb.minAvailable $pdb.maxUnavailable }}
polymq: {{ $name }}.pdb
    {{ $name }}.pdb sets both minAvailable and maxUnavailable; a PodDisruptionBudget takes
    one. Keep one and set the other to "".
{{- else if not (or $pdb.minAvailable $pdb.maxUnavailable) }}
polymq: {{ $name }}.pdb
    {{ $name }}.pdb.enabled=true with neither minAvailable nor maxUnavailable. Set
    {{ $name }}.pdb.maxUnavailable=1 (or disable the budget).
{{- else if and (not (kindIs "string" $pdb.minAvailable)) (not (and (hasKey $v "autoscaling") $v.autoscaling.enabled)) (ge (int $pdb.minAvailable) (int $v.replicaCount)) }}
polymq: {{ $name }}.pdb.minAvailable
    {{ $name }}.pdb.minAvailable={{ $pdb.minAvailable }} with {{ $v.replicaCount }} replica(s) forbids every
    voluntary eviction: node drains and cluster upgrades would hang. Use
    {{ $name }}.pdb.maxUnavailable=1 (and minAvailable="").
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "polymq.validateValues.metrics" -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) -}}
polymq: metrics.serviceMonitor.enabled
    metrics.serviceMonitor.enabled=true but metrics.enabled=false. Set metrics.enabled=true
    (every polymq process serves /metrics; the switch decides whether Prometheus is told).
{{- end -}}
{{- end -}}

{{/* The bridge runs the links of one links file: from bridge.links or an existing ConfigMap */}}
{{- define "polymq.validateValues.bridgeLinks" -}}
{{- $v := .Values.bridge }}
{{- if $v.enabled }}
{{- if and (not $v.links) (not $v.existingConfigMap) }}
polymq: bridge.links
    bridge.enabled=true with no links: the bridge would have nothing to move (and refuses to
    start). List them in bridge.links, e.g.
      bridge:
        links:
          - {name: orders-out, direction: polymq-to-rabbitmq, source: queue/orders,
             exchange: polymq.out, routing_key: orders.new}
          - {name: jobs-in, direction: rabbitmq-to-polymq, queue: jobs,
             destination: queue/jobs}
    or put a links file ({"links": [...]}, see polymq_bridge/config.py) in a ConfigMap:
      kubectl create configmap polymq-bridge-links --from-file=links.json
    and set bridge.existingConfigMap=polymq-bridge-links.
{{- else if and $v.links $v.existingConfigMap }}
polymq: bridge.existingConfigMap
    bridge.links and bridge.existingConfigMap={{ $v.existingConfigMap }} are both set: the bridge
    reads one links file. Keep the links in bridge.links and set bridge.existingConfigMap="",
    or move them into that ConfigMap and set bridge.links=[].
{{- else if $v.links }}
{{- $names := list }}
{{- range $v.links }}
{{- if has .name $names }}
polymq: bridge.links
    Two links are named {{ .name }}: each name must be unique (it labels the link's metrics and
    keys a stream link's progress in the core). Rename one of them.
{{- end }}
{{- $names = append $names .name }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The RabbitMQ URL holds credentials: it comes from a Secret, the chart's or yours */}}
{{- define "polymq.validateValues.bridgeRabbitmq" -}}
{{- $r := .Values.bridge.rabbitmq }}
{{- if .Values.bridge.enabled }}
{{- if and $r.url $r.existingSecret }}
polymq: bridge.rabbitmq.url
    bridge.rabbitmq.url is set and so is bridge.rabbitmq.existingSecret={{ $r.existingSecret }}: the bridge
    takes the URL from that Secret and would ignore this one. Unset one of them.
{{- else if and (not $r.url) (not $r.existingSecret) }}
polymq: bridge.rabbitmq.url
    bridge.enabled=true needs the RabbitMQ to connect to. Put its URL in a Secret:
      kubectl create secret generic polymq-bridge-rabbitmq \
        --from-literal=url=amqp://<user>:<password>@rabbitmq.<namespace>.svc:5672/<vhost>
    and set bridge.rabbitmq.existingSecret=polymq-bridge-rabbitmq, or let the chart make the
    Secret: --set bridge.rabbitmq.url=amqp://<user>:<password>@<host>:5672/
{{- else if and $r.url (not (regexMatch "^amqps?://([^@/?#]*@)?([^@/?#:\\[\\]]+|\\[[0-9A-Fa-f:.]+\\])(:[0-9]*)?([/?#].*)?$" $r.url)) }}
polymq: bridge.rabbitmq.url
    bridge.rabbitmq.url must look like amqp://user:password@host:5672/vhost (amqps:// for
    TLS); it starts with neither amqp:// nor amqps://, or names no host, or its port is not
    a number.
{{- end }}
{{- end }}
{{- end -}}
