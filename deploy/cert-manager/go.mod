// cert-manager, pinned here only for its CRDs (deploy/crds in its module): the chart's tests install them
// into their control plane to dry-run the chart rendered with certManager.enabled. Nothing is built.
module gpustack.ai/gpustack-models/deploy/cert-manager

go 1.26.0

require github.com/cert-manager/cert-manager v1.19.1
