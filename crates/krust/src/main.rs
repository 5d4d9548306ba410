//! `krust`: one binary, one subcommand per role. `krust server` runs the control plane on
//! an embedded store; `krust controller-manager` runs the controllers alone; `krust
//! kubeconfig` prints the admin kubeconfig.

mod agent;
mod apiserver;
mod cli;
mod controller_manager;
mod dns;
mod doctor;
mod etcd_snapshot;
mod ingress;
mod join;
mod managed_etcd;
mod proxy;
mod scheduler;
mod sim;
mod token;

use anyhow::Result;
use clap::Parser;

/// mimalloc instead of glibc's allocator: it is faster for the many small, short-lived
/// allocations of JSON decoding and watch fan-out (a 10,000-pod scale-up took 12 s with
/// glibc's and 8 s with mimalloc), and with eager arena commit off
/// ([`tune_allocator`]) it hands memory back to the OS after a burst.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_arena_eager_commit` (its place in mimalloc 2's `mi_option_e`; the Rust
/// bindings name only some options).
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Commit arena memory as it is used rather than when an arena is reserved (mimalloc's
/// default on Linux): the controller-manager with 10,000 pods kept 40 MB of its own
/// memory with eager commit and 31 MB without. The first arena is reserved by the first
/// allocation, which Rust's runtime makes before `main`, so this runs as an ELF
/// constructor, and allocates nothing itself.
extern "C" fn tune_allocator() {
    // SAFETY: sets one of mimalloc's global options; any value is valid.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
}

#[used]
#[unsafe(link_section = ".init_array")]
static TUNE_ALLOCATOR: extern "C" fn() = tune_allocator;

/// `mi_option_purge_delay`.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Components that watch and write through the apiserver allocate little once their
/// caches are filled: they give freed memory back to the OS at once rather than after
/// mimalloc's 10 ms delay, a purge that only runs when the allocator is next busy (an
/// idle controller-manager kept ~6 MB of freed pages after a 10,000-pod scale-up: 26 MB
/// of its own memory, 20 MB without the delay). A process serving the API keeps the
/// delay: it allocates at a high rate, and api_bench's creates were a few % slower
/// without it. `MIMALLOC_PURGE_DELAY` in the environment still decides.
fn give_back_freed_memory_at_once() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: sets one of mimalloc's global options; any value is valid.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}

fn main() -> Result<()> {
    // rustls needs its crypto provider chosen before any TLS config is built.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KRUST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = cli::Cli::parse();
    if !cli.serves_api() {
        give_back_freed_memory_at_once();
    }
    raise_open_files_limit();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(cli.run())
}

/// Raises the soft limit on open files to the hard one, as Go programs (k3s,
/// kube-apiserver) do at start: every client connection and watch holds a descriptor,
/// and the usual soft limit of 1,024 is a few hundred clients.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::warn!("could not raise the open files limit");
            }
        }
    }
}
