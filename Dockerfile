# The genbox service images, one Dockerfile for the four services: a static binary built with a
# patched Go toolchain, run as non-root on distroless. SERVICE names the directory under services/
# to build (publisher, worker, resulthandler or dlqnotifier). Build from the repository root:
#   docker build --build-arg SERVICE=worker -t worker .

# Go 1.26.11: the newest 1.26 patch release, fixing standard-library advisories that the 1.26.8
# of go.mod's minimum does not (pinned by exact tag; bump with each Go security release).
FROM golang:1.26.11-bookworm AS build
ENV GOTOOLCHAIN=local CGO_ENABLED=0 GOOS=linux
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Declared after the shared layers, so the four builds reuse the module download. No default: a
# build that forgets the argument fails instead of building some other service.
ARG SERVICE
RUN go build -trimpath -buildvcs=false -ldflags="-s -w" -o /out/service "./services/${SERVICE:?set --build-arg SERVICE=<a directory under services/>}"

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/service /service
USER nonroot:nonroot
ENTRYPOINT ["/service"]
