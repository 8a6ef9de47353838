{{- define "centroidkv.name" -}}
{{- if .Values.gpu.enabled }}{{ .Release.Name }}-centroidkv-gpu{{ else }}{{ .Release.Name }}-centroidkv{{ end }}
{{- end }}

{{- define "centroidkv.selectorLabels" -}}
app.kubernetes.io/name: centroidkv
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end }}

{{- define "centroidkv.image" -}}
{{ .Values.image.repository }}:{{ if .Values.gpu.enabled }}{{ .Values.gpu.imageTag }}{{ else }}{{ .Values.image.tag }}{{ end }}
{{- end }}

{{- define "centroidkv.checkGrace" -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (int .Values.server.gracePeriodSeconds) }}
{{- fail "terminationGracePeriodSeconds must exceed server.gracePeriodSeconds" }}
{{- end }}
{{- end }}

{{- define "centroidkv.securityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}
