# One router node. Mount a config and the model configs; backends the config starts
# (llama-server, sd-server, ...) must be installed in a derived image or reached by URL.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app

COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY . .
RUN useradd --create-home router && mkdir -p /data && chown router /data
USER router

# The default config runs a standalone node with the simulated models on 0.0.0.0:8080 with
# its store in /data; replace it with your own (ROUTER_CONFIG or --config).
ENV ROUTER_CONFIG=/app/demo/config.docker.yaml
EXPOSE 8080
VOLUME ["/data"]
# Ready: database reachable, migrations applied, startup over, and on a slave registered with
# its master (GET /readyz on the address the config binds). Liveness alone: --live (/healthz).
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["python", "manage.py", "healthcheck"]
CMD ["python", "manage.py", "runrouter"]
