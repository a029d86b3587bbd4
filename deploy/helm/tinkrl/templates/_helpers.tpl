{{- define "tinkrl.fullname" -}}
{{- printf "%s" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "tinkrl.labels" -}}
app.kubernetes.io/name: tinkrl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tinkrl.serviceAccountName" -}}
{{- default (printf "%s-orchestrator" (include "tinkrl.fullname" .)) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "tinkrl.sandboxNamespace" -}}
{{- default .Release.Namespace .Values.sandbox.namespace -}}
{{- end -}}

{{- define "tinkrl.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end -}}

{{- define "tinkrl.envFrom" -}}
envFrom:
  - secretRef:
      name: {{ .Values.secrets.name }}
      optional: {{ .Values.secrets.optional }}
{{- end -}}

{{- define "tinkrl.runConfig" -}}
{{- $sandbox := dict "provider" "kubernetes" "kubernetes" (dict
      "namespace" (include "tinkrl.sandboxNamespace" .)
      "image_pull_policy" .Values.sandbox.imagePullPolicy
      "image_pull_secrets" .Values.sandbox.imagePullSecrets
      "node_selector" .Values.nodeGroups.sandbox.nodeSelector
      "tolerations" .Values.nodeGroups.sandbox.tolerations
      "run_as_user" .Values.sandbox.runAsUser
      "ttl_s" .Values.sandbox.ttlSeconds
      "ready_timeout_s" .Values.sandbox.readyTimeoutSeconds
      "max_concurrent" .Values.sandbox.maxConcurrent
      "cpu_limit_factor" .Values.sandbox.cpuLimitFactor
      "reap_on_start" true) -}}
{{- if .Values.sandbox.image }}{{- $_ := set $sandbox.kubernetes "image" .Values.sandbox.image }}{{- end -}}
{{- $cfg := merge (dict "sandbox" $sandbox) (deepCopy .Values.orchestrator.config) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- define "tinkrl.s3Env" -}}
- name: TINKRL_S3_ENDPOINT_URL
  value: {{ .Values.results.endpointUrl | quote }}
- name: AWS_DEFAULT_REGION
  value: {{ default "us-east-1" .Values.results.region | quote }}
{{- end -}}
