# The worker image: API server, informers, Celery worker/beat and the node plugin share it; the
# Deployment or DaemonSet picks the entry point (see deploy/).
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
EXPOSE 8443
CMD ["python", "-m", "gunicorn", "config.wsgi:application", "--bind", "0.0.0.0:8000"]
