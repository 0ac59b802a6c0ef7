{{/* One alerting rule of the PrometheusRule: a dict of root (the chart's context), name, alert (its values:
for, severity), expr, summary, description (Prometheus templates: $labels, $value). */}}
{{- define "gpustack-models.alertRule" -}}
{{- $rule := .root.Values.metrics.prometheusRule -}}
- alert: {{ .name }}
  expr: |-
    {{- .expr | trim | nindent 4 }}
  for: {{ .alert.for }}
  labels:
    severity: {{ .alert.severity }}
    {{- with $rule.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    summary: {{ .summary | toJson }}
    description: {{ .description | toJson }}
    {{- with $rule.runbookUrl }}
    runbook_url: {{ printf "%s#%s" . (lower $.name) | toJson }}
    {{- end }}
{{- end }}

{{/* The selector every expression on the product's own metrics carries: this release's namespace. */}}
{{- define "gpustack-models.alertScope" -}}
namespace={{ .Release.Namespace | quote }}
{{- end }}
