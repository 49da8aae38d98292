{{/*
Names are fixed by docs/designs/00-contracts.md (not derived from the release
name): the webhook, scheduler and controller find each other by them.
*/}}
{{- define "kgo.name" -}}kubeon-gpu-optimizer{{- end -}}
{{- define "kgo.webhookName" -}}kubeon-gpu-optimizer-webhook{{- end -}}
{{- define "kgo.extenderName" -}}kubeon-gpu-optimizer-extender{{- end -}}
{{- define "kgo.schedulerName" -}}kubeon-gpu-scheduler{{- end -}}
{{- define "kgo.scalerRole" -}}kubeon-gpu-optimizer-scaler{{- end -}}
{{- define "kgo.tlsSecret" -}}kubeon-gpu-optimizer-webhook-tls{{- end -}}

{{- define "kgo.labels" -}}
app.kubernetes.io/name: kubeon-gpu-optimizer
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubeon-gpu-optimizer
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "webhook") */}}
{{- define "kgo.selectorLabels" -}}
app.kubernetes.io/name: kubeon-gpu-optimizer
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kgo.componentLabels" -}}
{{ include "kgo.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kgo.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* kube-scheduler must not be newer than the API server: default to the cluster's minor. */}}
{{- define "kgo.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag -}}
{{- if not $tag -}}
{{- $minor := regexFind "^[0-9]+" .Capabilities.KubeVersion.Minor -}}
{{- $tag = printf "v%s.%s.0" .Capabilities.KubeVersion.Major $minor -}}
{{- end -}}
{{ .Values.scheduler.image.repository }}:{{ $tag }}
{{- end -}}

{{/* Pod-level security: every pod runs as 65532, seccomp RuntimeDefault. */}}
{{- define "kgo.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "kgo.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Scheduling knobs shared by every pod. */}}
{{- define "kgo.podPlacement" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
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

{{/* Namespaces the webhooks never see: kube-system and the optimizer's own. */}}
{{- define "kgo.webhookNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: ["kube-system", {{ .Release.Namespace | quote }}]
{{- end -}}

{{- define "kgo.webhookObjectSelector" -}}
objectSelector:
  matchExpressions:
    - key: gpu.kubeon.io/skip
      operator: NotIn
      values: ["true"]
{{- end -}}

{{/* The second scheduler's KubeSchedulerConfiguration (ConfigMap scheduler config). */}}
{{- define "kgo.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceLock: leases
  resourceName: {{ include "kgo.schedulerName" . }}
  resourceNamespace: {{ .Release.Namespace }}
profiles:
  - schedulerName: {{ include "kgo.schedulerName" . }}
    {{- if .Values.scheduler.percentageOfNodesToScore }}
    percentageOfNodesToScore: {{ .Values.scheduler.percentageOfNodesToScore }}
    {{- end }}
extenders:
  - urlPrefix: http://{{ include "kgo.extenderName" . }}.{{ .Release.Namespace }}.svc:8888
    filterVerb: filter
    prioritizeVerb: prioritize
    {{- if .Values.scheduler.extenderBinds }}
    bindVerb: bind
    {{- end }}
    weight: {{ .Values.scheduler.extenderWeight }}
    httpTimeout: {{ .Values.scheduler.httpTimeout }}
    enableHTTPS: false
    nodeCacheCapable: true
    ignorable: true
    {{- /* No managedResources: the extender is asked about every pod this profile schedules, the
    CPU-only pods the webhook routes here included (webhook.routeCpuPodsOnGpuNodes), so packing
    places them too (docs/designs/extender.md, "Profile"). */}}
{{- end -}}

{{/*
Values the guide names that this version does not act on: refused with a message rather than
accepted and ignored (docs/install.md, "Values this version refuses or reserves").
*/}}
{{- define "kgo.validateValues" -}}
{{- if .Values.burst.enabled -}}
{{- fail "burst.enabled=true: this version has no burst gateway; burst.enabled must stay false (burst.gateway is reserved)" -}}
{{- end -}}
{{- /* What the controller refuses to start with (controller/command.py hub_settings, run): refused here,
not left to a CrashLoopBackOff. */}}
{{- if and (eq .Values.capacity.provider "eks-nodegroups") (not .Values.capacity.eks.clusterName) -}}
{{- fail "capacity.provider=eks-nodegroups but capacity.eks.clusterName is not set: the controller needs the EKS cluster whose node groups it resizes (--eks-cluster)" -}}
{{- end -}}
{{- if eq .Values.capacity.provider "gke-nodepools" -}}
{{- range $key := list "project" "location" "cluster" -}}
{{- if not (index $.Values.capacity.gke $key) -}}
{{- fail (printf "capacity.provider=gke-nodepools but capacity.gke.%s is not set: the controller needs the GKE cluster whose node pools it resizes (--gke-%s)" $key $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq .Values.capacity.provider "aks-nodepools" -}}
{{- range $key := list "subscriptionId" "resourceGroup" "cluster" -}}
{{- if not (index $.Values.capacity.aks $key) -}}
{{- fail (printf "capacity.provider=aks-nodepools but capacity.aks.%s is not set: the controller needs the AKS cluster whose agent pools it resizes" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.hub.url -}}
{{- if not .Values.cluster -}}
{{- fail "hub.url is set but cluster is not: the controller needs this cluster's name at the hub (--cluster)" -}}
{{- end -}}
{{- if not .Values.hub.existingSecret -}}
{{- fail "hub.url is set but hub.existingSecret is not: the controller needs the cluster token (a Secret with key token)" -}}
{{- end -}}
{{- $seconds := 0.0 -}}
{{- $unit := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h)" (toString .Values.hub.pollInterval) -1 -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- $seconds = addf $seconds (mulf (float64 $number) (get $unit (trimPrefix $number .))) -}}
{{- end -}}
{{- if or (lt $seconds 1.0) (gt $seconds 86400.0) -}}
{{- fail (printf "hub.pollInterval=%s: must be between 1s and 24h" (toString .Values.hub.pollInterval)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
