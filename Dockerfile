# One image for every role; the Deployment or DaemonSet picks the command:
#   python manage.py runapiserver            the aggregated API (HTTPS :8443) and the plugins' tickets
#   python manage.py runinformers            list/watch into Celery
#   celery -A config worker                  the reconcilers
#   celery -A config beat                    periodic work (one in the cluster)
#   python manage.py runplugin --node $NODE  the node plugin (DaemonSet; HTTPS :9443)
#   gunicorn config.wsgi:application         the admin console
# Only the runtime requirements are installed; tests, linters and the local control plane stay out
# (.dockerignore). Build from a checkout where `make venv` has run: it generates the CSI gRPC stubs
# (gpustack_models/plugin/csi/generated/, from the protos the control plane's Go module pins), which the
# image copies with the package; the build stops if they are missing.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# One stage: the requirements' layer is rebuilt only when requirements.txt changes, and a builder's layer
# cache decides that from the instruction alone (a second stage's COPY --from has to copy the whole virtualenv
# before its cache can be checked). The installed requirements stay beside the virtualenv.
FROM ${BASE_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/gpustack-models/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=config.settings \
    HF_HUB_DISABLE_TELEMETRY=1 \
    GPUSTACK_DATA_DIR=/var/lib/gpustack-models
COPY requirements.txt /opt/gpustack-models/requirements.txt
RUN python -m venv /opt/gpustack-models \
    && /opt/gpustack-models/bin/pip install --no-compile -r /opt/gpustack-models/requirements.txt
WORKDIR /app
COPY manage.py ./
COPY config ./config
COPY gpustack_models ./gpustack_models
COPY templates ./templates
RUN python -c "import gpustack_models.plugin.csi.generated.csi_pb2" \
    && useradd --system --uid 10001 --home-dir /var/lib/gpustack-models --create-home gpustack \
    && SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput --verbosity 0 \
    && chown -R 10001 /var/lib/gpustack-models
USER 10001
EXPOSE 8443 9443 8000
CMD ["python", "manage.py", "runapiserver"]
