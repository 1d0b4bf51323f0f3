//! What the crate's own tests share: how a test that cannot run here says so, and a job
//! of several ranks joined from threads of the test process.

/// Skips a test that needs what this machine lacks (root, a raw socket, a network
/// namespace, a command), with one line saying why; under `.ci/run` (`QUIVER_CI` set),
/// which runs as root with every tool installed, fails instead, so that CI never passes a
/// test it did not run.
pub(crate) fn cannot_run(why: &str) {
    if std::env::var_os("QUIVER_CI").is_some() {
        panic!("{why} (QUIVER_CI is set: .ci/run must run this test)");
    }
    eprintln!("skipping: {why}");
}

/// The key of the stores [`jobs`] serves.
pub(crate) fn store_key() -> crate::job::rendezvous::StoreKey {
    crate::job::rendezvous::StoreKey::parse(&"5a".repeat(32)).unwrap()
}

/// Joins `size` ranks of one job with `config`, each from a thread of this process, with
/// a store served here; the jobs in rank order, and the store (which lives as long as
/// the handle).
pub(crate) fn jobs(
    size: u32,
    config: &crate::config::Config,
) -> (Vec<crate::Job>, crate::job::rendezvous::KvServerHandle) {
    let server = crate::job::rendezvous::KvServer::bind("127.0.0.1:0".parse().unwrap())
        .unwrap()
        .spawn(store_key());
    let url = format!("tcp://{}", server.local_addr());
    let mut id = [0u8; 4];
    getrandom::fill(&mut id).unwrap();
    let job_id = (u32::from_le_bytes(id) | 1).to_string();
    let joins: Vec<_> = (0..size)
        .map(|rank| {
            let env: std::collections::HashMap<&str, String> = [
                ("QUIVER_RANK", rank.to_string()),
                ("QUIVER_SIZE", size.to_string()),
                ("QUIVER_JOB_ID", job_id.clone()),
                ("QUIVER_JOB_TOKEN", "0123456789abcdef".to_string()),
                ("QUIVER_RENDEZVOUS", url.clone()),
                (crate::job::rendezvous::KEY_VAR, store_key().to_hex()),
            ]
            .into_iter()
            .collect();
            let config = config.clone();
            std::thread::spawn(move || {
                crate::Job::from_lookup(&|k| env.get(k).cloned(), config).unwrap()
            })
        })
        .collect();
    let jobs = joins.into_iter().map(|j| j.join().unwrap()).collect();
    (jobs, server)
}

/// Values a user might put in a variable, for property tests of the parsers: arbitrary
/// Unicode, numbers of every shape (signs, fractions, exponents, size suffixes, far past
/// `u64::MAX`), the spellings `f64` parses specially (`NaN`, `inf`), blanks, and the
/// prefixes of the structured forms (`hybrid:`, `tcp://`, `file://`, fault keys) with
/// such numbers and units after them.
pub(crate) fn arb_env_value() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    const NUMBER: &str = "[-+]?[0-9]{0,24}(\\.[0-9]{0,6})?([eE][-+]?[0-9]{1,3})?";
    const SPECIAL: &[&str] = &[
        "",
        " ",
        "\t",
        "0",
        "-0",
        "+0",
        "00",
        "1",
        "-1",
        "NaN",
        "nan",
        "-NaN",
        "inf",
        "-inf",
        "+infinity",
        "Infinity",
        "1e30",
        "-1e30",
        "1e-30",
        "1e308",
        "1e309",
        "4e-324",
        "2147483648",
        "4294967295",
        "4294967296",
        "-4294967295",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999G",
        "0x10",
        "1_000",
        "1,5",
        "½",
        "٣",
        "１２",
        "\u{0}",
        "é",
        "🦀",
        "on",
        "off",
        "auto",
        "hybrid",
        "hybrid:",
        "spin",
        "tcp://",
        "tcp://:1",
        "tcp://[::1]:0",
        "file://",
        "file:///",
        "file://relative",
        "loss=",
        "=",
        ",",
        "delay=1",
        "16G",
        "17G",
        "4G",
        "1K",
        "1023",
    ];
    const PREFIXES: &[&str] = &[
        "",
        "hybrid:",
        "tcp://127.0.0.1:",
        "tcp://[::1]:",
        "tcp://host:",
        "file:///tmp/",
        "loss=",
        "delay=",
        "reorder_delay=",
        "seed=",
        "loss=0.1,delay=",
    ];
    const SUFFIXES: &[&str] = &["", "K", "m", "G", "s", "ms", "us", "ns", "%", "x", " "];
    prop_oneof![
        3 => any::<String>(),
        3 => NUMBER.prop_map(String::from),
        2 => prop::sample::select(SPECIAL).prop_map(String::from),
        3 => (
            prop::sample::select(PREFIXES),
            NUMBER,
            prop::sample::select(SUFFIXES)
        )
            .prop_map(|(p, n, s)| format!("{p}{n}{s}")),
    ]
}

/// Cases per property of the variable parsers: 1024 (a parse takes microseconds), or
/// `PROPTEST_CASES` for a longer soak.
pub(crate) fn env_cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}
