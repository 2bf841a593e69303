{{/*
One Deployment of Camp's image in a given role. Call with
(dict "ctx" $ "component" "worker" "name" "..." "replicas" 2 "command" (list ...)
      "resources" {...} "recreate" true "web" false "placement" {...} "extraLabels" {...}
      "liveness" (list ...)).
*/}}
{{- define "camp.deployment" -}}
{{- $ := .ctx -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
  labels:
    {{- include "camp.labels" $ | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
    {{- with .extraLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  replicas: {{ .replicas }}
  revisionHistoryLimit: 3
  {{- if .recreate }}
  # Never two at once (a second beat doubles every tick; a second watcher doubles events).
  strategy:
    type: Recreate
  {{- end }}
  selector:
    matchLabels:
      {{- include "camp.selectorLabels" (dict "ctx" $ "component" .component) | nindent 6 }}
      {{- with .extraLabels }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
  template:
    metadata:
      labels:
        {{- include "camp.selectorLabels" (dict "ctx" $ "component" .component) | nindent 8 }}
        {{- with .extraLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        # Settings changes roll the pods.
        checksum/config: {{ include "camp.configData" $ | sha256sum }}
        {{- if not $.Values.existingSecret.name }}
        checksum/secret: {{ include "camp.secretData" $ | sha256sum }}
        {{- else }}
        # Your Secret's current content (read at install/upgrade): changing it and running
        # `helm upgrade` rolls the pods.
        checksum/secret: {{ (lookup "v1" "Secret" $.Release.Namespace $.Values.existingSecret.name).data | toJson | sha256sum }}
        {{- end }}
        {{- if and .web $.Values.metrics.scrapeAnnotations }}
        prometheus.io/scrape: "true"
        prometheus.io/port: "8000"
        prometheus.io/path: /metrics
        {{- end }}
        {{- with $.Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- include "camp.podSpecCommon" $ | nindent 6 }}
      terminationGracePeriodSeconds: 60
      containers:
        - name: {{ .component }}
          image: {{ include "camp.image" $ }}
          imagePullPolicy: {{ $.Values.image.pullPolicy }}
          command:
            {{- toYaml .command | nindent 12 }}
          envFrom:
            - configMapRef:
                name: {{ include "camp.fullname" $ }}
          env:
            {{- include "camp.secretEnv" $ | trim | nindent 12 }}
            {{- with $.Values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- if .web }}
          ports:
            - name: http
              containerPort: 8000
              protocol: TCP
          # /healthz: the process answers; /readyz: database, Redis and migrations (camp/health.py).
          startupProbe:
            httpGet: {path: /healthz, port: http}
            periodSeconds: 2
            failureThreshold: 60
          livenessProbe:
            httpGet: {path: /healthz, port: http}
            periodSeconds: 10
            timeoutSeconds: 3
          readinessProbe:
            httpGet: {path: /readyz, port: http}
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 3
          {{- end }}
          {{- with .liveness }}
          # Restarted when its loop stops making progress (camp/liveness.py).
          livenessProbe:
            exec:
              command:
                {{- toYaml . | nindent 16 }}
            initialDelaySeconds: 60
            periodSeconds: 60
            timeoutSeconds: 30
            failureThreshold: 3
          {{- end }}
          resources:
            {{- toYaml .resources | nindent 12 }}
          securityContext:
            {{- toYaml $.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "camp.volumeMounts" $ | nindent 12 }}
            {{- with $.Values.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        {{- include "camp.volumes" (dict "secretName" (include "camp.secretName" $)) | nindent 8 }}
        {{- with $.Values.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $.Values.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with .placement }}
      {{- with .nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- end }}
{{- end -}}
