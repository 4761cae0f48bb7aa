# Tandem: one image with every executable (tandem-router, tandem-prefill, tandem-decode, tandem,
# tandem-mkmodel, tandem-bench, ... whatever build/bin holds), for the Helm chart in helm/tandem.
# docs/DEPLOY.md explains the build arguments.
#
#   CPU build (default):
#     docker build -t tandem:0.1.0 .
#   CUDA build (the builder needs nvcc; builder and runtime must be the same distribution):
#     docker build -t tandem:0.1.0-cuda \
#       --build-arg BUILDER_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04 \
#       --build-arg RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04 \
#       --build-arg TANDEM_CUDA=ON --build-arg CUDA_ARCHITECTURES="100;103" .

ARG BUILDER_IMAGE=debian:12
ARG RUNTIME_IMAGE=debian:12

# ---------------------------------------------------------------------------------------------
# Builder: the project's own package list (scripts/setup), then a Release build.
FROM ${BUILDER_IMAGE} AS builder

ARG TANDEM_CUDA=OFF
ARG CUDA_ARCHITECTURES=""
ENV DEBIAN_FRONTEND=noninteractive

WORKDIR /src
# Packages first, in their own layer: source edits do not reinstall them.
COPY scripts/setup scripts/setup
RUN sh scripts/setup && rm -rf /var/lib/apt/lists/*

COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA="${TANDEM_CUDA}" \
        ${CUDA_ARCHITECTURES:+"-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}"} \
    && cmake --build build -j "$(nproc)" \
    && test -n "$(ls build/bin)"

# The runtime packages: the Debian package owning each shared library the executables load
# (libcuda.so.1 belongs to the driver on the host and is skipped). Computed, not listed by hand,
# so a new dependency of any executable reaches the runtime image by itself.
RUN set -eu; \
    for lib in $(ldd build/bin/* | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u); do \
        real="$(readlink -f "$lib")"; \
        pkg=""; \
        for path in "$lib" "$real" "/usr$lib" "${lib#/usr}" "/usr$real" "${real#/usr}"; do \
            pkg="$(dpkg -S "$path" 2>/dev/null | head -n 1 | cut -d: -f1)" && [ -n "$pkg" ] && break; \
        done; \
        if [ -n "$pkg" ]; then echo "$pkg"; else echo "runtime libs: no package owns $lib" >&2; fi; \
    done | sort -u > /runtime-packages.txt; \
    echo "runtime packages:"; cat /runtime-packages.txt

# ---------------------------------------------------------------------------------------------
# Runtime: the executables and the shared libraries they load, nothing else.
FROM ${RUNTIME_IMAGE} AS runtime

# Loaded at run time without showing in ldd: the InfiniBand/RoCE verbs providers UCX's rc
# transport opens, ucx_info to see which transports UCX found, CA certificates.
ARG RUNTIME_EXTRA_PACKAGES="ibverbs-providers ucx-utils ca-certificates"
ENV DEBIAN_FRONTEND=noninteractive

COPY --from=builder /runtime-packages.txt /usr/share/tandem/runtime-packages.txt
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends \
        $(cat /usr/share/tandem/runtime-packages.txt) ${RUNTIME_EXTRA_PACKAGES} \
    && rm -rf /var/lib/apt/lists/*

COPY --from=builder /src/build/bin/ /usr/local/bin/

# Every executable must find its libraries here (the GPU driver's libcuda comes from the host).
RUN set -eu; missing="$(ldd /usr/local/bin/* | grep 'not found' | grep -v 'libcuda\.so' || true)"; \
    if [ -n "$missing" ]; then echo "missing libraries: $missing" >&2; exit 1; fi

# The router runs as this user; GPU workers run as root with IPC_LOCK (helm/tandem/values.yaml).
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin tandem
USER 10001
WORKDIR /tmp

# Router HTTP (OpenAI API, /health, /metrics), router control (ZeroMQ), worker /health and /metrics.
EXPOSE 8000 5557 9100

LABEL org.opencontainers.image.title="tandem" \
      org.opencontainers.image.description="Tandem disaggregated prefill/decode LLM serving: every executable"

# The chart sets the command per role (tandem-router, tandem-prefill, tandem-decode).
CMD ["tandem-router", "--help"]
