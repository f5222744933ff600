# Tailor's image: built in a Rust image, run from distroless as a non-root user with nothing
# but the binary and the C runtime it links (glibc, libgcc). The image's tailor has every
# command, `tailor report` included (the `report` feature).
#   docker build -t tailor .

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src benches \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for b in scheduling backtest rightsizing agent; do echo 'fn main() {}' > benches/$b.rs; done \
    && cargo build --profile dist --locked --features report \
    && rm -rf src benches
COPY src ./src
COPY benches ./benches
RUN touch src/main.rs src/lib.rs && cargo build --profile dist --locked --features report --bin tailor

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/dist/tailor /usr/local/bin/tailor
# distroless' nonroot user; the chart also sets runAsNonRoot and a read-only root filesystem.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/tailor"]
CMD ["run"]
