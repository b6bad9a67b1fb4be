{{/* Chart name, truncated to leave room for suffixes. */}}
{{- define "egress-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: the release name, plus the chart name unless the release already contains it. */}}
{{- define "egress-gateway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "egress-gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the pods of one component; call with (dict "ctx" $ "component" "agent"). */}}
{{- define "egress-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "egress-gateway.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every label of an object of one component. */}}
{{- define "egress-gateway.labels" -}}
{{ include "egress-gateway.selectorLabels" . }}
app.kubernetes.io/part-of: egress-gateway
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ include "egress-gateway.chart" .ctx }}
{{- end -}}

{{- define "egress-gateway.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "egress-gateway.agentName" -}}
{{- printf "%s-agent" (include "egress-gateway.fullname" .) -}}
{{- end -}}

{{- define "egress-gateway.controllerName" -}}
{{- printf "%s-controller" (include "egress-gateway.fullname" .) -}}
{{- end -}}

{{/* Headless Service whose DNS name lists the reflectors (the controller pods) for the agents. */}}
{{- define "egress-gateway.reflectorService" -}}
{{- printf "%s-reflector" (include "egress-gateway.fullname" .) -}}
{{- end -}}

{{/* A duration such as 500ms, 5s or 1m30s, in milliseconds (as a number in a string). */}}
{{- define "egress-gateway.durationMs" -}}
{{- $total := 0.0 -}}
{{- $units := dict "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h)" . -1 -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 -}}
{{- $unit := regexReplaceAll "^[0-9]+(\\.[0-9]+)?" . "" -}}
{{- $total = addf $total (mulf $num (get $units $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* Checks between values that the schema cannot express; the binary makes the same checks at start. */}}
{{- define "egress-gateway.validate" -}}
{{- $f := .Values.feature -}}
{{- $evict := include "egress-gateway.durationMs" $f.eipEvictionTimeout | float64 -}}
{{- $monitor := include "egress-gateway.durationMs" $f.tunnelMonitorPeriod | float64 -}}
{{- $update := include "egress-gateway.durationMs" $f.tunnelUpdatePeriod | float64 -}}
{{- if le $monitor 0.0 -}}
{{- fail "feature.tunnelMonitorPeriod must be greater than 0" -}}
{{- end -}}
{{- if le $update 0.0 -}}
{{- fail "feature.tunnelUpdatePeriod must be greater than 0" -}}
{{- end -}}
{{- if le $evict (addf $monitor $update) -}}
{{- fail (printf "feature.eipEvictionTimeout (%s) must be longer than feature.tunnelMonitorPeriod (%s) + feature.tunnelUpdatePeriod (%s): otherwise a healthy gateway whose heartbeat lands just after a check loses its EIPs" $f.eipEvictionTimeout $f.tunnelMonitorPeriod $f.tunnelUpdatePeriod) -}}
{{- end -}}
{{- $quarantine := include "egress-gateway.durationMs" $f.portReleaseQuarantine | float64 -}}
{{- if or (lt $quarantine 2000.0) (gt $quarantine 3600000.0) -}}
{{- fail (printf "feature.portReleaseQuarantine (%s) must be from 2s (the period of the agents' port reports) to 1h" $f.portReleaseQuarantine) -}}
{{- end -}}
{{- $range := splitList "-" $f.nodeIpPortRange -}}
{{- $first := index $range 0 | int -}}
{{- $last := index $range 1 | int -}}
{{- $size := int $f.portBlockSize -}}
{{- $whole := mul (div (add $first (sub $size 1)) $size) $size -}}
{{- if or (gt $first $last) (gt $last 65535) (gt (add $whole (sub $size 1)) $last) -}}
{{- fail (printf "feature.nodeIpPortRange (%s) holds no whole block of %d ports (feature.portBlockSize): useNodeIP policies would get no ports" $f.nodeIpPortRange $size) -}}
{{- end -}}
{{- $b := .Values.bgp -}}
{{- if and $b.enabled (eq $f.vxlan.underlay "ipv6") -}}
{{- if not (contains ":" $b.listenAddress) -}}
{{- fail (printf "bgp.listenAddress (%s) must be an IPv6 address (\"::\" for any) with feature.vxlan.underlay ipv6: the agents peer with the reflectors over IPv6" $b.listenAddress) -}}
{{- end -}}
{{- end -}}
{{- if and $b.enabled (gt (int $b.holdTime) 0) (ge (int $b.keepaliveTime) (int $b.holdTime)) -}}
{{- fail (printf "bgp.keepaliveTime (%d) must be less than bgp.holdTime (%d); a third of it is usual, 0 picks that" (int $b.keepaliveTime) (int $b.holdTime)) -}}
{{- end -}}
{{- if and $b.enabled $b.routerId (gt (int .Values.controller.replicas) 1) -}}
{{- fail (printf "bgp.routerId (%s) is one fixed id, but controller.replicas is %d and every reflector needs its own: leave bgp.routerId empty (each reflector then uses its pod's address: an IPv4 one, or the last 32 bits of an IPv6 one)" $b.routerId (int .Values.controller.replicas)) -}}
{{- end -}}
{{- if and $b.enabled (eq (int $b.listenPort) (int .Values.metrics.port)) -}}
{{- fail (printf "bgp.listenPort and metrics.port are both %d; the controller pods listen on both" (int $b.listenPort)) -}}
{{- end -}}
{{- end -}}

{{/* Flags that the agent and the controller share. */}}
{{- define "egress-gateway.commonArgs" -}}
- --datastore=kubernetes
- --lease-namespace={{ .Release.Namespace }}
- --tunnel-update-period={{ .Values.feature.tunnelUpdatePeriod }}
- --tunnel-monitor-period={{ .Values.feature.tunnelMonitorPeriod }}
- --eip-eviction-timeout={{ .Values.feature.eipEvictionTimeout }}
- --gateway-failover={{ .Values.feature.gatewayFailover.enable }}
{{- if .Values.feature.gatewayFailover.enable }}
- --probe-interval-ms={{ int64 .Values.feature.gatewayFailover.probeIntervalMs }}
- --probe-detect-multiplier={{ int64 .Values.feature.gatewayFailover.probeDetectMultiplier }}
{{- end }}
- --metrics-port={{ int64 .Values.metrics.port }}
{{- if .Values.log.json }}
- --log-json
{{- end }}
- --bgp={{ .Values.bgp.enabled }}
{{- if .Values.bgp.enabled }}
- --bgp-asn={{ int64 .Values.bgp.asn }}
- --bgp-hold-time={{ int64 .Values.bgp.holdTime }}
- --bgp-keepalive-time={{ int64 .Values.bgp.keepaliveTime }}
- --bgp-graceful-restart-time={{ int64 .Values.bgp.gracefulRestartTime }}
{{- end }}
{{- end -}}

{{/* Environment that the agent and the controller share. */}}
{{- define "egress-gateway.commonEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: RUST_LOG
  value: {{ .Values.log.level | quote }}
{{- if and .Values.bgp.enabled .Values.bgp.password.existingSecret }}
- name: EGRESS_BGP_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.bgp.password.existingSecret }}
      key: {{ .Values.bgp.password.key }}
{{- end }}
{{- end -}}
