{{/* Labels of every object the chart writes by hand (the generated ones carry part-of). */}}
{{- define "gpustack-models.labels" -}}
app.kubernetes.io/part-of: gpustack-models
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "gpustack-models.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gpustack-models.apiHost" -}}
gpustack-models-api.{{ .Release.Namespace }}.svc
{{- end }}

{{/*
The serving certificates the chart makes when cert-manager does not: the API's (for its Service, signed by
a CA of its own) and the plugins' CA (the API signs each plugin's certificate for its Pod IP with it).
Made once per render and kept across upgrades: an existing Secret is read back with lookup.
*/}}
{{- define "gpustack-models.pki" -}}
{{- if not (hasKey .Values "_pki") }}
{{- $ns := .Release.Namespace }}
{{- $pki := dict }}
{{- $api := lookup "v1" "Secret" $ns "gpustack-models-api-serving" }}
{{- if and $api $api.data (index $api.data "tls.crt") }}
{{- $_ := set $pki "apiCA" (index $api.data "ca.crt" | b64dec) }}
{{- $_ := set $pki "apiCert" (index $api.data "tls.crt" | b64dec) }}
{{- $_ := set $pki "apiKey" (index $api.data "tls.key" | b64dec) }}
{{- else }}
{{- $ca := genCA "gpustack-models-api-ca" 3650 }}
{{- $host := printf "gpustack-models-api.%s" $ns }}
{{- $names := list "gpustack-models-api" $host (printf "%s.svc" $host) (printf "%s.svc.cluster.local" $host) }}
{{- $cert := genSignedCert (printf "%s.svc" $host) nil $names 3650 $ca }}
{{- $_ := set $pki "apiCA" $ca.Cert }}
{{- $_ := set $pki "apiCert" $cert.Cert }}
{{- $_ := set $pki "apiKey" $cert.Key }}
{{- end }}
{{- $plugin := lookup "v1" "Secret" $ns "gpustack-models-plugin-ca" }}
{{- if and $plugin $plugin.data (index $plugin.data "tls.crt") }}
{{- $_ := set $pki "pluginCA" (index $plugin.data "tls.crt" | b64dec) }}
{{- $_ := set $pki "pluginKey" (index $plugin.data "tls.key" | b64dec) }}
{{- else }}
{{- $ca := genCA "gpustack-models-plugin-ca" 3650 }}
{{- $_ := set $pki "pluginCA" $ca.Cert }}
{{- $_ := set $pki "pluginKey" $ca.Key }}
{{- end }}
{{- $_ := set .Values "_pki" $pki }}
{{- end }}
{{- end }}

{{/* The API's serving CA for the APIService and the webhook; empty when cert-manager injects it. */}}
{{- define "gpustack-models.caBundle" -}}
{{- $source := include "gpustack-models.servingSource" . }}
{{- if eq $source "existing" }}
{{- include "gpustack-models.existingServingCA" . | b64enc }}
{{- else if eq $source "generated" }}
{{- include "gpustack-models.pki" . }}
{{- .Values._pki.apiCA | b64enc }}
{{- end }}
{{- end }}

{{/* Environment every role of the service shares (all but the plugin). */}}
{{- define "gpustack-models.serviceEnv" -}}
- name: GPUSTACK_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: DATABASE_URL
  valueFrom: {secretKeyRef: {name: {{ .Values.database.existingSecret | quote }}, key: {{ .Values.database.key | quote }}}}
- name: CELERY_BROKER_URL
  valueFrom: {secretKeyRef: {name: {{ .Values.redis.existingSecret | quote }}, key: {{ .Values.redis.key | quote }}}}
- name: CELERY_RESULT_BACKEND
  valueFrom: {secretKeyRef: {name: {{ .Values.redis.existingSecret | quote }}, key: {{ .Values.redis.key | quote }}}}
- name: SECRET_KEY
  valueFrom: {secretKeyRef: {name: {{ .Values.secretKey.existingSecret | default "gpustack-models-secret-key" | quote }}, key: SECRET_KEY}}
- name: GPUSTACK_DATA_DIR
  value: /var/lib/gpustack-models
- name: GPUSTACK_PLUGIN_PORT
  value: {{ .Values.plugin.port | quote }}
- name: GPUSTACK_PLUGIN_PEER_PORT
  value: {{ .Values.plugin.peerPort | quote }}
- name: GPUSTACK_DOWNLOAD_CONCURRENCY
  value: {{ .Values.plugin.download.concurrency | quote }}
- name: GPUSTACK_DOWNLOAD_BYTES_PER_SECOND
  value: {{ .Values.plugin.download.bytesPerSecond | int64 | quote }}
- name: GPUSTACK_UPLOAD_CONNECTIONS
  value: {{ .Values.plugin.upload.connections | quote }}
- name: GPUSTACK_UPLOAD_BYTES_PER_SECOND
  value: {{ .Values.plugin.upload.bytesPerSecond | int64 | quote }}
- name: GPUSTACK_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: GPUSTACK_LEADER_LEASE_SECONDS
  value: {{ .Values.leaderElection.leaseSeconds | quote }}
- name: GPUSTACK_LEADER_RENEW_DEADLINE_SECONDS
  value: {{ .Values.leaderElection.renewDeadlineSeconds | quote }}
- name: GPUSTACK_LEADER_RETRY_SECONDS
  value: {{ .Values.leaderElection.retrySeconds | quote }}
{{- range $name, $value := .Values.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}

{{/* The container security context of every role but the plugin. */}}
{{- define "gpustack-models.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 10001
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end }}

{{/* Waits until the database has every migration (the migrate Job of this revision applies them). */}}
{{- define "gpustack-models.waitForMigrations" -}}
- name: wait-for-migrations
  image: {{ include "gpustack-models.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["python", "manage.py", "waitformigrations"]
  env:
    {{- include "gpustack-models.serviceEnv" . | nindent 4 }}
  securityContext:
    {{- include "gpustack-models.restricted" . | nindent 4 }}
  volumeMounts:
    - {name: data, mountPath: /var/lib/gpustack-models}
{{- end }}

{{/*
Volumes every role of the service has: scratch space only. A node reads every Secret a Pod bound to it
references, whole (a volume's items limit only what is mounted), so the Secrets holding the serving and CA
keys are referenced by the API's Pods alone (api.yaml); no other role needs a certificate.
*/}}
{{- define "gpustack-models.serviceVolumes" -}}
- {name: data, emptyDir: {}}
- {name: tmp, emptyDir: {medium: Memory}}
{{- end }}

{{- define "gpustack-models.serviceMounts" -}}
- {name: data, mountPath: /var/lib/gpustack-models}
- {name: tmp, mountPath: /tmp}
{{- end }}

{{/*
The Pod-level settings of every role of the service: its ServiceAccount (the service's keeps its first name)
and whether its token is mounted (serviceAccount and automount, defaults gpustack-models-worker and true).
*/}}
{{- define "gpustack-models.servicePod" -}}
serviceAccountName: {{ .serviceAccount | default "gpustack-models-worker" }}
automountServiceAccountToken: {{ if hasKey . "automount" }}{{ .automount }}{{ else }}true{{ end }}
securityContext: {runAsNonRoot: true, runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001, seccompProfile: {type: RuntimeDefault}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "gpustack-models.placement" . }}
initContainers:
  {{- include "gpustack-models.waitForMigrations" .root | nindent 2 }}
{{- end }}

{{/* A role's metrics port and its probe. */}}
{{- define "gpustack-models.metricsPort" -}}
ports:
  - {name: metrics, containerPort: {{ .Values.metrics.port }}, protocol: TCP}
livenessProbe:
  httpGet: {path: /metrics, port: metrics}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 6
{{- end }}

{{/*
Where a role's Pods may run, from its values (priorityClassName, nodeSelector, tolerations, affinity,
topologySpreadConstraints): called with dict root, values and name (the role's app.kubernetes.io/name). A
topology spread constraint without a labelSelector gets the role's selector labels.
*/}}
{{- define "gpustack-models.placement" -}}
{{- with .values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- $spread := list }}
{{- range .values.topologySpreadConstraints }}
{{- $constraint := deepCopy . }}
{{- if not (hasKey $constraint "labelSelector") }}
{{- $_ := set $constraint "labelSelector" (dict "matchLabels" (dict "app.kubernetes.io/name" $.name "app.kubernetes.io/instance" $.root.Release.Name)) }}
{{- end }}
{{- $spread = append $spread $constraint }}
{{- end }}
{{- with $spread }}
topologySpreadConstraints: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
A role's Pod labels and annotations: its podLabels and podAnnotations under the chart's own, which win, so
podLabels cannot change the labels the selectors match. Called with dict root, values, name (the role's
app.kubernetes.io/name), component, and optionally labels and annotations (the chart's extra ones).
*/}}
{{- define "gpustack-models.podMetadata" -}}
{{- $own := include "gpustack-models.labels" .root | fromYaml }}
{{- $_ := set $own "app.kubernetes.io/name" .name }}
{{- $_ := set $own "app.kubernetes.io/component" .component }}
{{- $own = merge $own (.labels | default dict) (.values.podLabels | default dict) -}}
labels: {{- toYaml $own | nindent 2 }}
{{- with merge (.annotations | default dict) (.values.podAnnotations | default dict) }}
annotations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Where each certificate comes from: "existing" (a Secret the operator made, certificates.*.existingSecret),
"cert-manager" (certManager.enabled) or "generated" (the chart, kept across upgrades).
*/}}
{{- define "gpustack-models.servingSource" -}}
{{- if .Values.certificates.apiServing.existingSecret }}existing{{ else if .Values.certManager.enabled }}cert-manager{{ else }}generated{{ end }}
{{- end }}

{{- define "gpustack-models.pluginCASource" -}}
{{- if .Values.certificates.pluginCA.existingSecret }}existing{{ else if .Values.certManager.enabled }}cert-manager{{ else }}generated{{ end }}
{{- end }}

{{/* The Secrets holding the API's serving certificate and the plugins' CA (referenced by the API's Pods only). */}}
{{- define "gpustack-models.servingSecret" -}}
{{ .Values.certificates.apiServing.existingSecret | default "gpustack-models-api-serving" }}
{{- end }}

{{- define "gpustack-models.pluginCASecret" -}}
{{ .Values.certificates.pluginCA.existingSecret | default "gpustack-models-plugin-ca" }}
{{- end }}

{{/*
"true" when the API publishes the ConfigMap gpustack-models-ca from its mounted files (the chart writes it only
when it made both certificates itself: otherwise it does not know them, or they rotate without the chart).
*/}}
{{- define "gpustack-models.caPublished" -}}
{{- if or (ne (include "gpustack-models.servingSource" .) "generated") (ne (include "gpustack-models.pluginCASource" .) "generated") }}true{{ end }}
{{- end }}

{{/* "true" when cert-manager's CA injector fills the APIService's and the webhook's caBundle. */}}
{{- define "gpustack-models.caInjected" -}}
{{- if eq (include "gpustack-models.servingSource" .) "cert-manager" }}true{{ end }}
{{- end }}

{{/*
The PEM CA of an existing serving Secret: certificates.apiServing.caBundle, or its ca.crt read at install
(lookup; `helm template` without a cluster needs the value). Never a private key.
*/}}
{{- define "gpustack-models.existingServingCA" -}}
{{- $pem := .Values.certificates.apiServing.caBundle }}
{{- if not $pem }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace .Values.certificates.apiServing.existingSecret }}
{{- if and $secret $secret.data (index $secret.data "ca.crt") }}
{{- $pem = index $secret.data "ca.crt" | b64dec }}
{{- end }}
{{- end }}
{{- if not (contains "-----BEGIN CERTIFICATE-----" $pem) }}
{{- fail (printf "certificates.apiServing.caBundle: no CA certificate: set it, or create the Secret %s (with ca.crt) before installing" .Values.certificates.apiServing.existingSecret) }}
{{- end }}
{{- if contains "PRIVATE KEY" $pem }}
{{- fail "certificates.apiServing.caBundle holds a private key: give the CA certificate only" }}
{{- end }}
{{- $pem }}
{{- end }}

{{/*
The Pod spec of a hook (the CRD upgrade, the uninstall, helm test): the image as its non-root user with the
restricted security context, scheduled by the hooks block. Takes (dict "root" $ "serviceAccount" name
"name" container-name "command" list "restartPolicy" policy).
*/}}
{{- define "gpustack-models.hookPodSpec" -}}
{{- $hooks := .root.Values.hooks -}}
restartPolicy: {{ .restartPolicy | default "Never" }}
serviceAccountName: {{ .serviceAccount }}
automountServiceAccountToken: true
securityContext: {runAsNonRoot: true, runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001, seccompProfile: {type: RuntimeDefault}}
{{- if $hooks.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with $hooks.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $hooks.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $hooks.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $hooks.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: {{ .name }}
    image: {{ include "gpustack-models.image" .root }}
    imagePullPolicy: {{ .root.Values.image.pullPolicy }}
    command: {{- toJson .command | nindent 6 }}
    env:
      # A hook signs nothing with Django's key: one of its own, never the service's.
      - name: SECRET_KEY
        valueFrom: {fieldRef: {fieldPath: metadata.uid}}
      - name: GPUSTACK_NAMESPACE
        valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
      - {name: GPUSTACK_DATA_DIR, value: /tmp}
      {{- range $name, $value := $hooks.env }}
      - {name: {{ $name }}, value: {{ $value | quote }}}
      {{- end }}
    resources: {{- toYaml $hooks.resources | nindent 6 }}
    securityContext:
      {{- include "gpustack-models.restricted" .root | nindent 6 }}
    volumeMounts:
      - {name: tmp, mountPath: /tmp}
volumes:
  - {name: tmp, emptyDir: {medium: Memory}}
{{- end }}

{{/* The annotations of a hook object: its events, weight (order) and deletion (default: once it succeeded). */}}
{{- define "gpustack-models.hook" -}}
helm.sh/hook: {{ .events }}
helm.sh/hook-weight: {{ .weight | quote }}
helm.sh/hook-delete-policy: {{ .policy | default "before-hook-creation,hook-succeeded" }}
{{- end }}
