{{/* The chart's names and the parts every component shares. */}}

{{- define "railhook.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "railhook.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "api"). */}}
{{- define "railhook.selectorLabels" -}}
app.kubernetes.io/name: {{ .ctx.Chart.Name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "railhook.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "railhook.secretName" -}}
{{- .Values.existingSecret | default (printf "%s-secrets" (include "railhook.fullname" .)) -}}
{{- end -}}

{{/* The configuration every component reads: the secret, the brokers, `config`. */}}
{{- define "railhook.env" -}}
envFrom:
  - secretRef:
      name: {{ include "railhook.secretName" . }}
env:
  - name: RAILHOOK_KAFKA_BROKERS
    value: {{ .Values.kafka.brokers | quote }}
{{- range $key, $value := .Values.config }}
  - name: {{ $key }}
    value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* /healthz (the process is up) and /readyz (Postgres and Kafka answer; the worker's also its consumer group's join) on a named port. */}}
{{- define "railhook.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ . }}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ . }}
  periodSeconds: 5
  failureThreshold: 2
startupProbe:
  httpGet:
    path: /healthz
    port: {{ . }}
  periodSeconds: 2
  failureThreshold: 30
{{- end -}}

{{- define "railhook.podSpec" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A component's Deployment: (dict "ctx" $ "component" "relay" "replicas" 2 "args" (list "relay") "port" 9091 "portName" "ops" "extraEnv" (list ...) "values" .Values.relay). */}}
{{- define "railhook.deployment" -}}
{{- $ctx := .ctx -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "railhook.fullname" $ctx }}-{{ .component }}
  labels:
    {{- include "railhook.labels" $ctx | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  replicas: {{ .values.replicas }}
  {{- with .strategy }}
  strategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "railhook.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "railhook.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 8 }}
      annotations:
        checksum/config: {{ toYaml $ctx.Values.config | sha256sum }}
    spec:
      {{- include "railhook.podSpec" $ctx | trim | nindent 6 }}
      {{- with .values.terminationGracePeriodSeconds }}
      terminationGracePeriodSeconds: {{ . }}
      {{- end }}
      {{- if $ctx.Values.migrate.enabled }}
      initContainers:
        - name: migrate
          image: {{ include "railhook.image" $ctx }}
          imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
          args: ["migrate"]
          securityContext:
            {{- toYaml $ctx.Values.securityContext | nindent 12 }}
          {{- include "railhook.env" $ctx | nindent 10 }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "railhook.image" $ctx }}
          imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
          args: {{ toJson .args }}
          ports:
            - name: {{ .portName }}
              containerPort: {{ .port }}
              protocol: TCP
          securityContext:
            {{- toYaml $ctx.Values.securityContext | nindent 12 }}
          {{- include "railhook.env" $ctx | nindent 10 }}
            - name: {{ .listenEnv }}
              value: {{ printf "0.0.0.0:%v" .port | quote }}
          {{- include "railhook.probes" .portName | nindent 10 }}
          {{- with .values.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
{{- end -}}

{{/* The Service in front of a component's port: (dict "ctx" $ "component" "relay" "port" 9091 "portName" "ops" "servicePort" 9091 "type" "ClusterIP"). */}}
{{- define "railhook.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "railhook.fullname" .ctx }}-{{ .component }}
  labels:
    {{- include "railhook.labels" .ctx | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  type: {{ .type | default "ClusterIP" }}
  selector:
    {{- include "railhook.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
  ports:
    - name: {{ .portName }}
      port: {{ .servicePort }}
      targetPort: {{ .portName }}
      protocol: TCP
{{- end -}}
