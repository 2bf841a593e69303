# No `# syntax=` line: the Dockerfile frontend built into BuildKit (Docker 23+) handles
# RUN --mount, so a build needs no image pulled from Docker Hub for the frontend.
# Camp's image: one image for web (ASGI), worker, beat and the per-cluster watcher; the
# command picks the role (docker-compose.yml, deploy/helm/camp).
#
# Multi-architecture (linux/amd64 and linux/arm64, e.g. GH200 hosts): the base image is a
# multi-arch official image, every package comes from Debian's apt or pip (built in the build
# stage where no wheel exists), and nothing names an architecture. A binary ever downloaded
# here must be chosen by BuildKit's TARGETARCH (`ARG TARGETARCH`), never a literal one:
#   docker buildx build --platform linux/amd64,linux/arm64 -t registry.example.com/camp:0.1.0 --push .
#
# RUN lines use the ENV paths ($WHEELS, $VENV), never literal ones: the suite runs every
# RUN line of this file in a fresh virtualenv (tests/integration/deploy/test_dockerfile.py),
# since no Docker daemon runs on the project's machines.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: compilers and headers live only here ------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 WHEELS=/wheels
# python-ldap (requirements-ldap.txt) has no wheels: it compiles against these.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libldap2-dev libsasl2-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements.txt requirements-ldap.txt ./
RUN pip wheel --wheel-dir "$WHEELS" -r requirements.txt -r requirements-ldap.txt

# --- runtime: no compiler, no headers, not root -------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VENV=/opt/venv WHEELS=/wheels PATH=/opt/venv/bin:$PATH \
    DJANGO_SETTINGS_MODULE=camp.settings.production
# docker build --build-arg VERSION=$(git describe --tags) --build-arg REVISION=$(git rev-parse HEAD)
ARG VERSION=0.1.0
ARG REVISION=""
LABEL org.opencontainers.image.title="camp" \
      org.opencontainers.image.description="Camp, the AI compute scheduling platform (web, worker, beat, watcher)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# python-ldap's shared libraries; xmlsec1, with which pysaml2 checks SAML signatures;
# pg_dump/pg_restore (PostgreSQL 15's client) for `manage.py backup` / `restore`.
RUN apt-get update && apt-get install -y --no-install-recommends libldap-2.5-0 libsasl2-2 xmlsec1 \
    postgresql-client-15 \
    && rm -rf /var/lib/apt/lists/*
# A named group for gid 10001 too (without it Celery warns it runs "with superuser privileges").
RUN groupadd --system --gid 10001 camp \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /app --shell /usr/sbin/nologin camp
WORKDIR /app
COPY requirements.txt requirements-ldap.txt ./
# The wheels are bind-mounted from the build stage, so they never become a layer here.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv "$VENV" \
    && "$VENV/bin/pip" install --no-index --find-links "$WHEELS" -r requirements.txt -r requirements-ldap.txt
COPY . .
# Static files are collected into the image (whitenoise serves them, hashed and compressed),
# so no pod writes to its filesystem. Production settings refuse a missing SECRET_KEY; this
# throwaway one exists only for this build step and is not kept in the image.
RUN SECRET_KEY=collectstatic-at-build-time-only-not-a-runtime-secret-0123456789 \
    DATABASE_URL=sqlite:////tmp/collectstatic-needs-no-database.sqlite3 \
    ALLOWED_HOSTS=collectstatic.invalid \
    python manage.py collectstatic --noinput
RUN mkdir -p /var/lib/camp-anchor && chown 10001:10001 /var/lib/camp-anchor
USER 10001:10001
EXPOSE 8000
CMD ["uvicorn", "camp.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--proxy-headers"]
