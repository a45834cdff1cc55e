{{- define "fgpu.labels" -}}
app.kubernetes.io/name: fgpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "fgpu.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{- define "fgpu.pluginServiceAccount" -}}
system:serviceaccount:{{ .Release.Namespace }}:fgpu-kubelet-plugin
{{- end }}

{{- define "fgpu.apiServerEnv" -}}
{{- with .Values.kubeletPlugin.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
{{- end }}
{{- with .Values.kubeletPlugin.apiServer.port }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ . | quote }}
{{- end }}
{{- end }}
