"""The CSI driver ``model.csi.gpustack.ai``: the node plugin mounts cached models into Pods.

A Pod asks for a model with an inline ephemeral volume (``csi: {driver: model.csi.gpustack.ai,
readOnly: true, volumeAttributes: {artifact: NAME}}``); the kubelet calls NodePublishVolume on the
plugin's unix socket, the plugin asks the API whether that Pod may mount that artifact (with its
Pod-bound token; the API records the mount as a reference, so the digest enters this node's
``spec.models``), and bind-mounts the published tree read-only once it is Ready here.

- ``generated``: the gRPC stubs of ``csi.proto`` and the kubelet's plugin registration (made by
  ``deploy/protos/protos.sh`` from the protos committed there, never committed themselves);
- ``validation``: what a NodePublishVolume / NodeUnpublishVolume request must carry;
- ``mount_client``: the API's mount endpoint, its refusals as gRPC codes;
- ``beneath``: paths opened without following symbolic links, read-only bind mounts through descriptors;
- ``bind_mounts``: ``/proc/self/mountinfo``, one record per published volume;
- ``progress_text``: the message a person reads in the Pod's events while the model is not Ready;
- ``driver``: the Identity and Node services;
- ``registration``: the kubelet's plugin-registration service, and the servers on their sockets;
- ``mounter``: the privileged part of the plugin's Pod (``--role mounter``), the driver alone;
- ``shared_files``: what the mounter and the non-root node role tell each other through the node's disk.
"""

DRIVER_NAME = "model.csi.gpustack.ai"
VENDOR_VERSION = "0.1.0"
SOCKET_PATH_MAX = 107  # bytes of sun_path, without its terminating NUL
