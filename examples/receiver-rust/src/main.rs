//! `DATABASE_URL=postgres://... WEBHOOK_SECRET="whsec_... [whsec_...]" PORT=8000 railhook-example-receiver`

use std::process::ExitCode;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use railhook_example_receiver::{app, migrate, AppState};
use railhook_receiver::{Secret, Verifier};

fn main() -> ExitCode {
    match tokio::runtime::Runtime::new().map_err(anyhow::Error::from).and_then(|rt| rt.block_on(try_main())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn try_main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL").map_err(|_| anyhow::anyhow!("set DATABASE_URL"))?;
    let secrets = std::env::var("WEBHOOK_SECRET").map_err(|_| anyhow::anyhow!("set WEBHOOK_SECRET (whsec_...; several separated by spaces)"))?;
    let secrets: Vec<Secret> = secrets.split_whitespace().map(str::parse).collect::<Result<_, _>>()?;
    let port: u16 = std::env::var("PORT").unwrap_or_else(|_| "8000".into()).parse()?;

    let manager = Manager::from_config(url.parse()?, tokio_postgres::NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = Pool::builder(manager).max_size(10).runtime(Runtime::Tokio1).build()?;
    migrate(&pool).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app(AppState { verifier: Verifier::new(secrets), pool })).await?;
    Ok(())
}
