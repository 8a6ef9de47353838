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

{{- /* The server's security flags (pool mode). */ -}}
{{- define "centroidkv.securityArgs" -}}
{{- with .Values.security }}
{{- if .tls.enabled }}
- --tls-cert=/etc/centroidkv/tls/tls.crt
- --tls-key=/etc/centroidkv/tls/tls.key
- --tls-refresh-seconds={{ .tls.refreshSeconds }}
{{- if .tls.mtls }}
- --tls-client-ca=/etc/centroidkv/tls/ca.crt
{{- end }}
{{- end }}
{{- if .tokens.secretName }}
- --auth-tokens-file=/etc/centroidkv/auth/tokens
{{- end }}
{{- if .maxCallerStreams }}
- --max-caller-streams={{ .maxCallerStreams }}
{{- end }}
{{- if .maxCallerJobs }}
- --max-caller-jobs={{ .maxCallerJobs }}
{{- end }}
{{- if ne (toString .maxCallerBytes) "0" }}
- --max-caller-bytes={{ .maxCallerBytes }}
{{- end }}
{{- end }}
{{- end }}

{{- /* A probe of the gRPC port: the health service, or a TCP connect under TLS. */ -}}
{{- define "centroidkv.probe" -}}
{{- if .Values.security.tls.enabled }}
tcpSocket:
  port: {{ .Values.server.grpcPort }}
{{- else }}
grpc:
  port: {{ .Values.server.grpcPort }}
{{- end }}
{{- end }}
