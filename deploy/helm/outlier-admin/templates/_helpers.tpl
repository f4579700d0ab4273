{{/* Names and labels (Kubernetes recommended labels). */}}
{{- define "outlier-admin.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "outlier-admin.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "outlier-admin.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "outlier-admin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one role: include "outlier-admin.selectorLabels" (list . "web") */}}
{{- define "outlier-admin.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "outlier-admin.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "outlier-admin.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "outlier-admin.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "outlier-admin.fullname" .)) -}}
{{- end -}}

{{/*
Environment of every control-plane container: the ConfigMap's settings, and the secrets as files
(settings read NAME_FILE for every NAME, so no secret value is ever in the pod's environment).
The pod's own IP joins ALLOWED_HOSTS: kubelet probes and Prometheus address the pod by IP.
*/}}
{{- define "outlier-admin.env" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: ALLOWED_HOSTS
  value: {{ printf "%s,$(POD_IP)" (join "," .Values.allowedHosts) | quote }}
- name: DATABASE_URL_FILE
  value: /etc/outlier-admin/secrets/DATABASE_URL
- name: REDIS_URL_FILE
  value: /etc/outlier-admin/secrets/REDIS_URL
- name: SECRET_KEY_FILE
  value: /etc/outlier-admin/secrets/SECRET_KEY
{{- range (include "outlier-admin.optionalSecretKeys" . | fromJsonArray) }}
- name: {{ . }}_FILE
  value: /etc/outlier-admin/secrets/{{ . }}
{{- end }}
{{- end -}}

{{/* The optional secret keys present: from the values, or as listed for an existing Secret. */}}
{{- define "outlier-admin.optionalSecretKeys" -}}
{{- $keys := list -}}
{{- if .Values.secrets.existingSecret -}}
{{- $keys = .Values.secrets.existingSecretOptionalKeys -}}
{{- else -}}
{{- if .Values.secrets.metricsToken }}{{ $keys = append $keys "METRICS_TOKEN" }}{{ end -}}
{{- if .Values.secrets.brokerUrl }}{{ $keys = append $keys "CELERY_BROKER_URL" }}{{ end -}}
{{- end -}}
{{- toJson $keys -}}
{{- end -}}

{{- define "outlier-admin.envFrom" -}}
- configMapRef:
    name: {{ include "outlier-admin.fullname" . }}-config
{{- end -}}

{{/* Volumes: the secrets, and writable scratch space under a read-only root file system. */}}
{{- define "outlier-admin.volumes" -}}
- name: secrets
  secret:
    secretName: {{ include "outlier-admin.secretName" . }}
    defaultMode: 0440
- name: tmp
  emptyDir: {}
- name: prometheus-multiproc
  emptyDir: {}
{{- end -}}

{{- define "outlier-admin.volumeMounts" -}}
- name: secrets
  mountPath: /etc/outlier-admin/secrets
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: prometheus-multiproc
  mountPath: /run/prometheus
{{- end -}}

{{/* What every control-plane pod shares. `volumes` stays its last key: the web pod appends its proxy's. */}}
{{- define "outlier-admin.podCommon" -}}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
volumes:
  {{- include "outlier-admin.volumes" . | nindent 2 }}
{{- end -}}

{{- define "outlier-admin.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The web pod's nginx configuration: deploy/nginx/nginx.conf (files/nginx.conf links to it), its
upstream (compose's `web` service) made gunicorn on the pod's loopback. */}}
{{- define "outlier-admin.proxyConfig" -}}
{{- $conf := .Files.Get "files/nginx.conf" -}}
{{- if not (contains "server web:8000;" $conf) -}}
{{- fail "files/nginx.conf has no upstream `server web:8000;` to point at the pod's gunicorn" -}}
{{- end -}}
{{- if eq (int .Values.web.port) (int .Values.web.ingest.port) -}}
{{- fail "web.ingest.port must differ from web.port (two gunicorns in one pod)" -}}
{{- end -}}
{{- if not (contains "server ingest:8000;" $conf) -}}
{{- fail "files/nginx.conf has no upstream `server ingest:8000;` to point at the pod's ingest gunicorn" -}}
{{- end -}}
{{- $marker := "    # set_real_ip_from: trusted proxies in front of nginx" -}}
{{- if not (contains $marker $conf) -}}
{{- fail "files/nginx.conf has no `# set_real_ip_from:` line to write web.trustedProxies on" -}}
{{- end -}}
{{- $realIp := list $marker -}}
{{- range .Values.web.trustedProxies -}}
{{- $realIp = append $realIp (printf "    set_real_ip_from %s;" .) -}}
{{- end -}}
{{- $conf | replace "server web:8000;" (printf "server 127.0.0.1:%d;" (int .Values.web.port)) | replace "server ingest:8000;" (printf "server 127.0.0.1:%d;" (int .Values.web.ingest.port)) | replace $marker (join "\n" $realIp) -}}
{{- end -}}

{{/* TRUSTED_PROXIES of the web and ingest containers: the pod's nginx, the ingress (web.trustedProxies),
and any proxy named in config. */}}
{{- define "outlier-admin.trustedProxies" -}}
{{- concat (list "127.0.0.1") .Values.web.trustedProxies (list (.Values.config.TRUSTED_PROXIES | default "")) | compact | join "," -}}
{{- end -}}
