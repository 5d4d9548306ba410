//! SPDY/3.1 frames as a runtime's streaming server might send them: any bytes read as
//! frames until the end, an error, or a frame that claims more than is there.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut input = data;
        let mut consumed = 0;
        while let Ok(Some(frame)) = krust_httpstream::spdy::read_frame(&mut input).await {
            // Each frame is at least its 8-byte header: reading never loops in place.
            let left = input.len();
            assert!(data.len() - left >= consumed + 8, "{frame:?}");
            consumed = data.len() - left;
        }
    });
});
