FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
# xmlsec1: pysaml2 checks SAML signatures with it (SAML_ENABLED, docs/AUTH.md)
RUN apt-get update && apt-get install -y --no-install-recommends xmlsec1 \
    && rm -rf /var/lib/apt/lists/*
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
RUN useradd --system --uid 1000 camp && mkdir -p var && chown -R camp var
USER camp
EXPOSE 8000
