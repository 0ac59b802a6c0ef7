"""Health endpoints: always answered, never authenticated (kube-apiserver and the kubelet probe them)."""

from django.http import HttpResponse


async def health(request):
    return HttpResponse("ok", content_type="text/plain")
