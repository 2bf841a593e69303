{{/* Names and labels, the way `helm create` lays them out. */}}
{{- define "camp.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "camp.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "camp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "camp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "web"). */}}
{{- define "camp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "camp.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "camp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "camp.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "camp.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "camp.secretName" -}}
{{- default (include "camp.fullname" .) .Values.existingSecret.name -}}
{{- end -}}

{{/* The secret settings' names (each mounted as a file and read as NAME_FILE). */}}
{{- define "camp.secretKeys" -}}
{{- if .Values.existingSecret.name -}}
{{- toJson .Values.existingSecret.keys -}}
{{- else -}}
{{- $keys := list "SECRET_KEY" "DATABASE_URL" "REDIS_URL" -}}
{{- range $k, $_ := .Values.extraSecrets }}{{ $keys = append $keys $k }}{{ end -}}
{{- toJson $keys -}}
{{- end -}}
{{- end -}}

{{/* Evaluation mode: the generated password and secret key, kept across upgrades (read back
from the evaluation Secret when it exists), generated once per render otherwise. */}}
{{- define "camp.evaluation" -}}
{{- if not (hasKey .Values.evaluation "generated") -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (printf "%s-evaluation" (include "camp.fullname" .)) | default dict -}}
{{- $data := get $existing "data" | default dict -}}
{{- $password := get $data "password" | b64dec | default (randAlphaNum 32) -}}
{{- $secretKey := get $data "secretKey" | b64dec | default (randAlphaNum 64) -}}
{{- $_ := set .Values.evaluation "generated" (dict "password" $password "secretKey" $secretKey) -}}
{{- end -}}
{{- end -}}

{{- define "camp.secretKeyValue" -}}
{{- if .Values.secretKey -}}{{ .Values.secretKey }}
{{- else if .Values.evaluation.enabled -}}{{ include "camp.evaluation" . }}{{ .Values.evaluation.generated.secretKey }}
{{- else -}}{{ required "secretKey is required (a long random string), or set existingSecret.name" .Values.secretKey }}
{{- end -}}
{{- end -}}

{{- define "camp.databaseUrl" -}}
{{- if .Values.database.url -}}{{ .Values.database.url }}
{{- else if .Values.evaluation.enabled -}}{{ include "camp.evaluation" . }}postgres://camp:{{ .Values.evaluation.generated.password }}@{{ include "camp.fullname" . }}-postgresql:5432/camp
{{- else -}}{{ required "database.url is required (postgres://...), or set existingSecret.name" .Values.database.url }}
{{- end -}}
{{- end -}}

{{- define "camp.redisUrl" -}}
{{- if .Values.redis.url -}}{{ .Values.redis.url }}
{{- else if .Values.evaluation.enabled -}}{{ include "camp.evaluation" . }}redis://:{{ .Values.evaluation.generated.password }}@{{ include "camp.fullname" . }}-redis:6379/0
{{- else -}}{{ required "redis.url is required (redis://...), or set existingSecret.name" .Values.redis.url }}
{{- end -}}
{{- end -}}

{{/* The Secret's data: the chart refuses to render without the three it cannot guess
(outside evaluation mode). */}}
{{- define "camp.secretData" -}}
SECRET_KEY: {{ include "camp.secretKeyValue" . | b64enc | quote }}
DATABASE_URL: {{ include "camp.databaseUrl" . | b64enc | quote }}
REDIS_URL: {{ include "camp.redisUrl" . | b64enc | quote }}
{{- range $k, $v := .Values.extraSecrets }}
{{ $k }}: {{ $v | toString | b64enc | quote }}
{{- end }}
{{- end -}}

{{/* The initial admin (manage.py initial_admin in the migrations Job): on when a username
or a Secret is given. */}}
{{- define "camp.initialAdmin" -}}
{{- if or .Values.initialAdmin.username .Values.initialAdmin.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* TRUSTED_PROXY_COUNT: the value, or 1 behind the chart's own ingress, else 0. */}}
{{- define "camp.trustedProxyCount" -}}
{{- if kindIs "invalid" .Values.trustedProxyCount -}}
{{- ternary 1 0 .Values.ingress.enabled -}}
{{- else -}}
{{- int .Values.trustedProxyCount -}}
{{- end -}}
{{- end -}}

{{- define "camp.configData" -}}
DJANGO_SETTINGS_MODULE: camp.settings.production
ALLOWED_HOSTS: {{ join "," .Values.allowedHosts | quote }}
CSRF_TRUSTED_ORIGINS: {{ join "," .Values.csrfTrustedOrigins | quote }}
CAMP_URL: {{ .Values.campUrl | default (printf "https://%s" (first .Values.ingress.hosts | default (first .Values.allowedHosts))) | quote }}
SECURE_SSL_REDIRECT: {{ .Values.secureSslRedirect | toString | quote }}
LOG_LEVEL: {{ .Values.logLevel | quote }}
{{- if .Values.evaluation.enabled }}
CAMP_EVALUATION: "true"
{{- end }}
{{- if not (hasKey .Values.env "TRUSTED_PROXY_COUNT") }}
TRUSTED_PROXY_COUNT: {{ include "camp.trustedProxyCount" . | quote }}
{{- end }}
{{- range $k, $v := .Values.env }}
{{ $k }}: {{ $v | toString | quote }}
{{- end }}
{{- end -}}

{{/* Environment, volumes and security shared by every Camp container. */}}
{{- define "camp.envFrom" -}}
- configMapRef:
    name: {{ .configMap }}
{{- end -}}

{{- define "camp.secretEnv" -}}
{{- range (include "camp.secretKeys" . | fromJsonArray) }}
- name: {{ . }}_FILE
  value: /run/secrets/camp/{{ . }}
{{- end }}
{{- end -}}

{{- define "camp.volumes" -}}
- name: secrets
  secret:
    secretName: {{ .secretName }}
    defaultMode: 0440
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "camp.volumeMounts" -}}
- name: secrets
  mountPath: /run/secrets/camp
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "camp.podSpecCommon" -}}
serviceAccountName: {{ include "camp.serviceAccountName" . }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
