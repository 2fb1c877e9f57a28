{{- define "tidegate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tidegate.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tidegate.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tidegate.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
{{- end -}}

{{/* the model flags every engine-running container gets */}}
{{- define "tidegate.modelArgs" -}}
- --model
- {{ .Values.model.path | quote }}
{{- with .Values.model.servedName }}
- --served-model-name
- {{ . | quote }}
{{- end }}
{{- $tp := mul (int .Values.backend.gpus) (int .Values.backend.nodes) }}
{{- if gt $tp 1 }}
- --tensor-parallel-size
- {{ $tp | quote }}
{{- end }}
{{- end -}}

{{- define "tidegate.modelVolume" -}}
{{- if .Values.model.claimName }}
- name: model
  persistentVolumeClaim:
    claimName: {{ .Values.model.claimName }}
    readOnly: true
{{- end }}
{{- end -}}

{{- define "tidegate.modelMount" -}}
{{- if .Values.model.claimName }}
- name: model
  mountPath: /models
  readOnly: true
{{- end }}
{{- end -}}

{{- define "tidegate.checkCurve" -}}
{{- if and (not .Values.curve.secretName) (not .Values.curve.insecure) -}}
{{- fail "mode gateway needs curve.secretName (CURVE keys for the ZeroMQ wire) or curve.insecure=true" -}}
{{- end -}}
{{- end -}}

{{/* a tensor-parallel rank's environment over several hosts (the pod's interface for gloo/NCCL) */}}
{{- define "tidegate.rankEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef: {fieldPath: metadata.name}
- name: PYTHONUNBUFFERED
  value: "1"
- name: NCCL_SOCKET_IFNAME
  value: eth0
- name: GLOO_SOCKET_IFNAME
  value: eth0
{{- end -}}

{{- define "tidegate.backendResources" -}}
requests:
  {{- toYaml .Values.backend.resources.requests | nindent 2 }}
  nvidia.com/gpu: {{ .Values.backend.gpus }}
limits:
  {{- toYaml .Values.backend.resources.limits | nindent 2 }}
  nvidia.com/gpu: {{ .Values.backend.gpus }}
{{- end -}}
