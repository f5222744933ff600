# Tailor's image: built in a Rust image, run from distroless as a non-root user with nothing
# but the binary and the C runtime it links (glibc, libgcc). The image's tailor has every
# command, `tailor report` included (the `report` feature).
#   docker build -t tailor .

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
# Cargo refuses a manifest whose declared targets have no file: every [[bench]] and [[test]]
# it names gets an empty stand-in.
RUN mkdir src benches tests \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for b in $(sed -n '/^\[\[bench\]\]/{n;s/^name = "\(.*\)"/\1/p}' Cargo.toml); do echo 'fn main() {}' > benches/$b.rs; done \
    && for t in $(sed -n '/^\[\[test\]\]/{n;s/^name = "\(.*\)"/\1/p}' Cargo.toml); do touch tests/$t.rs; done \
    && cargo build --profile dist --locked --features report \
    && rm -rf src benches tests
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
