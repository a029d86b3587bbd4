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
{{- $_ := set $sandbox.kubernetes "image" (default (include "tinkrl.image" .) .Values.sandbox.image) -}}
{{- $cfg := merge (dict "sandbox" $sandbox) (deepCopy .Values.orchestrator.config) (dict "runs_dir" .Values.orchestrator.runsDir) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The proxy's model: the local engine serves the default model (its GGUF file is in the image) or
     proxy.model; the Tinker service serves only the model it is told, so backend tinker needs one. */}}
{{- define "tinkrl.proxyArgs" -}}
{{- $p := .Values.proxy -}}
{{- if not (has $p.backend (list "local" "tinker")) -}}
{{- fail (printf "proxy.backend must be local or tinker (got %q)" $p.backend) -}}
{{- end -}}
{{- if and (eq $p.backend "tinker") (not $p.model) (not $p.checkpoint) -}}
{{- fail "proxy.backend=tinker needs proxy.model (a model the Tinker service serves, e.g. Qwen/Qwen3-8B) or proxy.checkpoint" -}}
{{- end -}}
{{- if and $p.model $p.checkpoint -}}
{{- fail "proxy.model and proxy.checkpoint: set one (a checkpoint knows its base model)" -}}
{{- end -}}
- --backend
- {{ $p.backend }}
{{- with $p.model }}
- --model
- {{ . | quote }}
{{- end }}
{{- with $p.checkpoint }}
- --checkpoint
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "tinkrl.s3Env" -}}
- name: TINKRL_S3_ENDPOINT_URL
  value: {{ .Values.results.endpointUrl | quote }}
- name: AWS_DEFAULT_REGION
  value: {{ default "us-east-1" .Values.results.region | quote }}
{{- end -}}

{{/* The Secret holding the proxy's key (TINKRL_API_KEY): the user's proxy.apiKey.existingSecret, else the
     one this chart generates (proxy-key.yaml). */}}
{{- define "tinkrl.proxyKeySecret" -}}
{{- default (printf "%s-proxy-key" (include "tinkrl.fullname" .)) .Values.proxy.apiKey.existingSecret -}}
{{- end -}}

{{- define "tinkrl.proxyKeyEnv" -}}
- name: TINKRL_API_KEY
  valueFrom:
    secretKeyRef: {name: {{ include "tinkrl.proxyKeySecret" . }}, key: TINKRL_API_KEY}
{{- end -}}
