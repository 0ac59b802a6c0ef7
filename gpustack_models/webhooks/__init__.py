"""What kube-apiserver calls on the API process as an admission webhook: placement of Pods that mount a model.

- ``placement``: the mutating webhook;
- ``urls``: its route.
"""
