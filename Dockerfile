# One image for every role; the Deployment or DaemonSet picks the command:
#   python manage.py runapiserver            the aggregated API (HTTPS :8443) and the plugins' tickets
#   python manage.py runinformers            list/watch into Celery
#   celery -A config worker --beat           the reconcilers (one beat in the cluster)
#   python manage.py runplugin --node $NODE  the node plugin (DaemonSet; HTTPS :9443)
#   gunicorn config.wsgi:application         the admin console
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    GPUSTACK_DATA_DIR=/var/lib/gpustack-models

WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY manage.py ./
COPY config ./config
COPY gpustack_models ./gpustack_models
COPY templates ./templates
COPY deploy/crds ./deploy/crds
RUN python manage.py collectstatic --noinput --verbosity 0

RUN useradd --system --uid 10001 --home-dir /var/lib/gpustack-models --create-home gpustack
USER 10001
EXPOSE 8443 9443 8000
CMD ["python", "manage.py", "runapiserver"]
