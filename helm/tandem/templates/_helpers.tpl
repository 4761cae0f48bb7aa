{{/*
_helpers.tpl - names, labels and the pieces every Tandem pod shares.

Worker templates (prefill Deployment, decode StatefulSet) call the helpers below with a dict:
  root: the chart's top-level context ($)
  role: "prefill" or "decode"
  rack: one entry of .Values.racks
Inside them, $w is the role's values section (.Values.prefill or .Values.decode); the chart test
checks every $w.<path> against both sections.
*/}}

{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- /* Full name: release-chart, or the release name alone when it already contains the chart
name. Kept to 30 characters so <fullname>-decode-<rack>-<ordinal> fits the 63-character pod
hostname limit with a 20-character rack name. */}}
{{- define "tandem.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 30 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 30 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 30 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tandem.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- /* Labels on every object that are not selector labels. */}}
{{- define "tandem.commonLabels" -}}
helm.sh/chart: {{ include "tandem.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tandem
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- /* Labels of objects that belong to no single role. */}}
{{- define "tandem.labels" -}}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "tandem.commonLabels" . }}
{{- end }}

{{- /* Selector labels of one role: dict root, role, and optional rack (a racks entry). */}}
{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
tandem/role: {{ .role }}
{{- if .rack }}
tandem/rack: {{ .rack.name }}
{{- end }}
{{- end }}

{{- /* Every label of one role's objects and pods: dict root, role, optional rack. */}}
{{- define "tandem.roleLabels" -}}
{{ include "tandem.selectorLabels" . }}
{{ include "tandem.commonLabels" .root }}
{{- end }}

{{- define "tandem.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "tandem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tandem.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- /* The router's control address the workers connect to (--router). */}}
{{- define "tandem.routerControlAddress" -}}
{{- printf "tcp://%s-router-control.%s.svc.%s:%v" (include "tandem.fullname" .) .Release.Namespace .Values.clusterDomain .Values.router.ports.control }}
{{- end }}

{{- /* Name of a rack group's workload of one role: dict root, role, rack. */}}
{{- define "tandem.workloadName" -}}
{{- printf "%s-%s-%s" (include "tandem.fullname" .root) .role .rack.name }}
{{- end }}

{{- /* Fail early on a rack name Kubernetes or the router would not take. */}}
{{- define "tandem.checkRacks" -}}
{{- if not .Values.racks }}
{{- fail "racks: list at least one rack group" }}
{{- end }}
{{- $seen := dict }}
{{- range .Values.racks }}
{{- if not (regexMatch "^[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?$" (toString .name)) }}
{{- fail (printf "racks: name %q must be 1-20 lowercase letters, digits or '-', starting and ending with a letter or digit" (toString .name)) }}
{{- end }}
{{- if hasKey $seen .name }}
{{- fail (printf "racks: name %q appears twice" .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
{{- end }}
{{- if not (has .Values.model.source (list "pvc" "hostPath" "random")) }}
{{- fail (printf "model.source: %q must be pvc, hostPath or random" .Values.model.source) }}
{{- end }}
{{- if not (has .Values.topology.mode (list "required" "preferred" "none")) }}
{{- fail (printf "topology.mode: %q must be required, preferred or none" .Values.topology.mode) }}
{{- end }}
{{- if not (has .Values.autoscaling.engine (list "keda" "hpa")) }}
{{- fail (printf "autoscaling.engine: %q must be keda or hpa" .Values.autoscaling.engine) }}
{{- end }}
{{- end }}

{{- /* A group's value for one role's setting, falling back to the role's: dict root, role, rack,
key. A group may set 0, so presence (hasKey) decides, not truth. */}}
{{- define "tandem.rackValue" -}}
{{- $w := index .root.Values .role }}
{{- $over := default dict (index .rack .role) }}
{{- if hasKey $over .key }}
{{- index $over .key }}
{{- else if eq .key "replicas" }}
{{- $w.replicas }}
{{- else if eq .key "minReplicas" }}
{{- $w.autoscaling.minReplicas }}
{{- else if eq .key "maxReplicas" }}
{{- $w.autoscaling.maxReplicas }}
{{- end }}
{{- end }}

{{- /* A value as text. YAML numbers reach templates as float64, which would print a large
whole number as 1.8798001e+07: whole numbers print as integers. */}}
{{- define "tandem.str" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}
{{- int64 . }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{- /* ConfigMap data: TANDEM_<FLAG> keys from flag maps. Takes a list of maps, later ones win;
empty values are left out so the executable's default applies. */}}
{{- define "tandem.flagEnv" -}}
{{- $merged := dict }}
{{- range . }}
{{- range $flag, $value := . }}
{{- $_ := set $merged $flag $value }}
{{- end }}
{{- end }}
{{- range $flag, $value := $merged }}
{{- if not (or (kindIs "invalid" $value) (eq (toString $value) "")) }}
{{ printf "TANDEM_%s" ($flag | replace "-" "_" | upper) }}: {{ include "tandem.str" $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- /* UCX environment for the worker ConfigMaps; empty values are left out. */}}
{{- define "tandem.ucxEnv" -}}
{{- range $name, $value := .Values.ucx.env }}
{{- if not (eq (toString $value) "") }}
{{ $name }}: {{ include "tandem.str" $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- /* Startup, readiness and liveness probes on the role's /health: dict probes (the role's
probes section) and port (a port name). A probe's own `path` (e.g. readiness.path) overrides
probes.path for that probe. */}}
{{- define "tandem.probes" -}}
startupProbe:
  httpGet:
    path: {{ default .probes.path .probes.startup.path }}
    port: {{ .port }}
  periodSeconds: {{ .probes.startup.periodSeconds }}
  failureThreshold: {{ .probes.startup.failureThreshold }}
  timeoutSeconds: {{ .probes.startup.timeoutSeconds }}
readinessProbe:
  httpGet:
    path: {{ default .probes.path .probes.readiness.path }}
    port: {{ .port }}
  periodSeconds: {{ .probes.readiness.periodSeconds }}
  failureThreshold: {{ .probes.readiness.failureThreshold }}
  timeoutSeconds: {{ .probes.readiness.timeoutSeconds }}
livenessProbe:
  httpGet:
    path: {{ default .probes.path .probes.liveness.path }}
    port: {{ .port }}
  periodSeconds: {{ .probes.liveness.periodSeconds }}
  failureThreshold: {{ .probes.liveness.failureThreshold }}
  timeoutSeconds: {{ .probes.liveness.timeoutSeconds }}
{{- end }}

{{- /* The model volume (pod spec `volumes` entry). */}}
{{- define "tandem.modelVolume" -}}
- name: model
{{- if eq .Values.model.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ default (printf "%s-model" (include "tandem.fullname" .)) .Values.model.pvc.existingClaim }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" }}
  hostPath:
    path: {{ .Values.model.hostPath.path }}
    type: {{ .Values.model.hostPath.type }}
{{- else }}
  emptyDir:
    sizeLimit: {{ .Values.model.random.sizeLimit }}
{{- end }}
{{- end }}

{{- define "tandem.modelVolumeMount" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: {{ ne .Values.model.source "random" }}
{{- end }}

{{- /* With model.source random: an init container that writes the random-weight checkpoint. */}}
{{- define "tandem.modelInitContainers" -}}
{{- if eq .Values.model.source "random" }}
- name: mkmodel
  image: {{ include "tandem.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - tandem-mkmodel
    - --preset
    - {{ .Values.model.random.preset | quote }}
    - --seed
    - {{ .Values.model.random.seed | quote }}
    - --out
    - {{ .Values.model.path | quote }}
  volumeMounts:
    - name: model
      mountPath: {{ .Values.model.mountPath }}
{{- end }}
{{- end }}

{{- /* Downward-API environment every Tandem pod gets. */}}
{{- define "tandem.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}

{{- /* Affinity of a rack group's worker pods: dict root, role, rack. The role's own `affinity`
replaces it; a group with a domain is pinned there; otherwise the group's pods attract each other
within one NVLink domain (topology.mode). */}}
{{- define "tandem.workerAffinity" -}}
{{- $root := .root }}
{{- $w := index $root.Values .role }}
{{- $topo := $root.Values.topology }}
{{- if $w.affinity }}
{{- toYaml $w.affinity }}
{{- else if .rack.domain }}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: {{ $topo.domainLabel }}
            operator: In
            values:
              - {{ .rack.domain | quote }}
{{- else if ne $topo.mode "none" }}
{{- $term := printf "topologyKey: %s\nlabelSelector:\n  matchLabels:\n    app.kubernetes.io/instance: %s\n    tandem/rack: %s" $topo.domainLabel $root.Release.Name .rack.name }}
podAffinity:
{{- if eq $topo.mode "required" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - {{ $term | nindent 6 | trim }}
{{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        {{- $term | nindent 8 }}
{{- end }}
{{- if and $topo.separateGroups (gt (len $root.Values.racks) 1) }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 50
      podAffinityTerm:
        topologyKey: {{ $topo.domainLabel }}
        labelSelector:
          matchLabels:
            app.kubernetes.io/instance: {{ $root.Release.Name }}
          matchExpressions:
            - key: tandem/rack
              operator: NotIn
              values:
                - {{ .rack.name }}
{{- end }}
{{- end }}
{{- end }}

{{- /* Pod template of a rack group's worker (prefill or decode): dict root, role, rack. */}}
{{- define "tandem.workerPodTemplate" -}}
{{- $root := .root }}
{{- $w := index $root.Values .role }}
metadata:
  labels:
    {{- include "tandem.roleLabels" . | nindent 4 }}
    {{- with $w.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
    {{- with $w.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "tandem.serviceAccountName" $root }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ $w.terminationGracePeriodSeconds }}
  {{- if $w.hostNetwork }}
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  {{- end }}
  {{- with $w.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "tandem.workerAffinity" . | trim) }}
  affinity:
    {{- . | nindent 4 }}
  {{- end }}
  {{- with $w.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.resourceClaims }}
  resourceClaims:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "tandem.modelInitContainers" $root | trim) }}
  initContainers:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .role }}
      image: {{ include "tandem.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command:
        - tandem-{{ .role }}
      envFrom:
        - configMapRef:
            name: {{ include "tandem.fullname" $root }}-{{ .role }}
      env:
        {{- include "tandem.podEnv" . | nindent 8 }}
        - name: TANDEM_RACK
          value: {{ .rack.name | quote }}
        {{- if $root.Values.security.curve.existingSecret }}
        - name: TANDEM_CURVE_KEY
          value: /etc/tandem/curve/worker.key
        - name: TANDEM_CURVE_ROUTER_KEY
          value: /etc/tandem/curve/router.pub
        {{- end }}
        {{- if eq .role "decode" }}
        {{- if ge (int $root.Values.decode.drainTimeoutSeconds) (int $w.terminationGracePeriodSeconds) }}
        {{- fail "decode.drainTimeoutSeconds must be below decode.terminationGracePeriodSeconds" }}
        {{- end }}
        - name: TANDEM_DRAIN_TIMEOUT_MS
          value: {{ mul (int $root.Values.decode.drainTimeoutSeconds) 1000 | quote }}
        {{- if $root.Values.decode.spill.enabled }}
        # the disk tier of idle sessions (docs/DEPLOY.md "Session tiers")
        - name: TANDEM_SPILL_DIR
          value: {{ $root.Values.decode.spill.mountPath | quote }}
        - name: TANDEM_SPILL_MAX_MB
          value: {{ int64 $root.Values.decode.spill.maxMB | toString | quote }}
        {{- end }}
        {{- end }}
        {{- with $w.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: http
          containerPort: {{ $w.ports.http }}
          protocol: TCP
      {{- include "tandem.probes" (dict "probes" $w.probes "port" "http") | nindent 6 }}
      {{- if eq .role "decode" }}
      # Drain (docs/DEPLOY.md 12): SIGTERM makes the node admit nothing new, finish its streams
      # (at most decode.drainTimeoutSeconds), say Goodbye and exit 0. preStop sends it and waits
      # for the exit, inside terminationGracePeriodSeconds.
      lifecycle:
        preStop:
          exec:
            command: ["/bin/sh", "-c", "kill -TERM 1; while kill -0 1 2>/dev/null; do sleep 1; done"]
      {{- end }}
      resources:
        {{- toYaml $w.resources | nindent 8 }}
        {{- with $w.resourceClaims }}
        claims:
          {{- range . }}
          - name: {{ .name }}
          {{- end }}
        {{- end }}
      securityContext:
        {{- toYaml $w.securityContext | nindent 8 }}
      volumeMounts:
        {{- include "tandem.modelVolumeMount" $root | nindent 8 }}
        {{- if $root.Values.shm.enabled }}
        - name: shm
          mountPath: /dev/shm
        {{- end }}
        {{- if and (eq .role "decode") $root.Values.decode.spill.enabled }}
        - name: spill
          mountPath: {{ $root.Values.decode.spill.mountPath }}
        {{- end }}
        {{- if $root.Values.security.curve.existingSecret }}
        - name: curve
          mountPath: /etc/tandem/curve
          readOnly: true
        {{- end }}
        {{- with $w.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    {{- include "tandem.modelVolume" $root | nindent 4 }}
    {{- if $root.Values.shm.enabled }}
    - name: shm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $root.Values.shm.sizeLimit }}
    {{- end }}
    {{- if and (eq .role "decode") $root.Values.decode.spill.enabled (eq $root.Values.decode.spill.type "emptyDir") }}
    - name: spill
      emptyDir:
        sizeLimit: {{ $root.Values.decode.spill.size }}
    {{- end }}
    {{- if $root.Values.security.curve.existingSecret }}
    - name: curve
      secret:
        secretName: {{ $root.Values.security.curve.existingSecret }}
        defaultMode: 0444
        items:
          - key: worker.key
            path: worker.key
          - key: router.pub
            path: router.pub
    {{- end }}
    {{- with $w.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
