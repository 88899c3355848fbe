# The example plugin's model as a model image: its artifact (config.json, model.safetensors
# and the golden cases) under /models and nothing else, what
# examples/bring-your-own-model.yaml serves as model.uri: oci://<image>. Trained here at
# build, on the plugin's synthetic users (about a minute on a CPU), by the team's ranker image
# (examples/sasrec/Dockerfile). Build from this folder:
#   docker build --build-arg RANKER_IMAGE=registry.example.com/feed/ranker-sasrec:0.1.0 \
#     -f model.Dockerfile -t registry.example.com/feed/sasrec-model:s1 .
# A model trained elsewhere needs only: FROM scratch + COPY <artifact dir> /models/.
ARG RANKER_IMAGE=ghcr.io/kvrank/ranker-sasrec:0.1.0
FROM ${RANKER_IMAGE} AS artifact
ARG MODEL_VERSION=s1
RUN python -m kvrank_sasrec.train --out /tmp/model --version "${MODEL_VERSION}" --seed 0 \
 && kvrank check-model /tmp/model

FROM scratch
ARG MODEL_VERSION=s1
LABEL org.opencontainers.image.title="kvrank-sasrec-model" \
      org.opencontainers.image.vendor="kvrank" \
      io.kvrank.model-version="${MODEL_VERSION}"
COPY --from=artifact /tmp/model/ /models/
