fn main() {
    tonic_prost_build::configure()
        .compile_protos(&["proto/csi.proto"], &["proto/"])
        .expect("compiling proto/csi.proto (is protoc installed?)");
}
