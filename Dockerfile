# One image for every role; the Deployment or DaemonSet picks the command:
#   python manage.py runapiserver            the aggregated API (HTTPS :8443) and the plugins' tickets
#   python manage.py runinformers            list/watch into Celery
#   celery -A config worker                  the reconcilers
#   celery -A config beat                    periodic work (one in the cluster)
#   python -m gpustack_models.plugin --node $NODE  the node plugin (DaemonSet; HTTPS :9443)
#   gunicorn config.wsgi:application         the admin console
# Only the runtime requirements are installed; tests, linters and the local control plane stay out
# (.dockerignore). It builds from a fresh clone (`docker build .`, nothing to run first): a build stage
# compiles the CSI and plugin-registration gRPC stubs from the protos committed in deploy/protos/ with
# deploy/protos/protos.sh (what `make protos` runs in a checkout); the image copies the generated package
# alone, never grpcio-tools, nor a checkout's own stubs (.dockerignore).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# The stubs: grpcio-tools at the version deploy/protos/requirements.txt pins (the checkout's too), in this
# stage only. Two steps: a warm build checks little more than the protos' content (they change with Kubernetes).
FROM ${BASE_IMAGE} AS stubs
COPY deploy/protos /src/deploy/protos
RUN python -m venv /opt/protoc \
    && /opt/protoc/bin/pip install --no-cache-dir --disable-pip-version-check --no-compile \
        -r /src/deploy/protos/requirements.txt \
    && /src/deploy/protos/protos.sh /opt/protoc/bin/python /out/generated

# The image, one stage for the requirements: their layer is rebuilt only when requirements.txt changes, and a
# builder's layer cache decides that from the instruction alone (a COPY --from of a whole virtualenv would have
# to be copied before its cache can be checked). The installed requirements stay beside the virtualenv.
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
COPY --from=stubs /out/generated ./gpustack_models/plugin/csi/generated
RUN python -c "import gpustack_models.plugin.csi.generated.csi_pb2" \
    && useradd --system --uid 10001 --home-dir /var/lib/gpustack-models --create-home gpustack \
    && SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput --verbosity 0 \
    && chown -R 10001 /var/lib/gpustack-models
USER 10001
EXPOSE 8443 9443 8000
CMD ["python", "manage.py", "runapiserver"]
