use pgrx::prelude::*;

#[pg_test]
fn take_admits_then_refuses() {
    Spi::run("SET pg_ratelimit.allow_explicit_clock = on").unwrap();
    let r = Spi::get_one::<pgrx::JsonB>("SELECT rl_take('k', 1, 60, 1, 0)").unwrap().unwrap();
    assert_eq!(r.0["admitted"], true);
}
