// prometheus-operator, pinned here only for its CRDs (example/prometheus-operator-crd in its module): the chart's
// tests install the PrometheusRule and ServiceMonitor CRDs into their control plane to dry-run the chart rendered
// with metrics.prometheusRule and metrics.serviceMonitor. Nothing is built.
module gpustack.ai/gpustack-models/deploy/prometheus-operator

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.86.1
