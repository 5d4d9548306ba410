fn main() {
    tonic_prost_build::configure()
        .compile_protos(
            &["proto/csi.proto", "proto/pluginregistration.proto"],
            &["proto/"],
        )
        .expect("compiling the protos (is protoc installed?)");
}
