//! The embedded mode's users, namespaces, quotas and audit trail, read and changed in its data dir.

use crate::cli::teams::{AuditArgs, MemberCommand, NamespaceCommand, QuotaArgs, UserCommand};
use anyhow::Context as _;
use std::process::ExitCode;

pub(crate) fn user(command: UserCommand) -> anyhow::Result<ExitCode> {
    use labforge_web::users::Users;
    match command {
        UserCommand::Add {
            name,
            admin,
            data_dir,
        } => {
            let password = Users::open(&data_dir)?.add(&name, admin)?;
            println!("user {name} added; password (shown once): {password}");
        }
        UserCommand::List { data_dir } => {
            for user in Users::open(&data_dir)?.list() {
                let role = if user.admin { "admin" } else { "user" };
                println!("{}\t{}\tnamespace {}", user.name, role, user.namespace);
            }
        }
        UserCommand::Reset { name, data_dir } => {
            let password = Users::open(&data_dir)?.reset_password(&name)?;
            println!("new password for {name} (shown once): {password}");
        }
        UserCommand::Remove { name, data_dir } => {
            Users::open(&data_dir)?.remove(&name)?;
            labforge_web::tokens::Tokens::open(&data_dir)?.revoke_user(&name)?;
            println!("user {name} removed");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn namespace(command: NamespaceCommand) -> anyhow::Result<ExitCode> {
    use labforge_web::namespaces::Namespaces;
    use labforge_web::users::Users;
    let open = |dir: &std::path::Path| -> anyhow::Result<(Users, Namespaces)> {
        Ok((Users::open(dir)?, Namespaces::open(dir)?))
    };
    match command {
        NamespaceCommand::Quota(args) => return namespace_quota(&args),
        NamespaceCommand::Add {
            name,
            owner,
            data_dir,
        } => {
            let (users, namespaces) = open(&data_dir)?;
            namespaces.add(&name, &owner, &users)?;
            println!("namespace {name} added, owned by {owner}");
        }
        NamespaceCommand::List { data_dir } => {
            let (users, namespaces) = open(&data_dir)?;
            for ns in namespaces.list(&users) {
                let members: Vec<String> = ns
                    .members
                    .iter()
                    .map(|(user, role)| format!("{user} ({})", role.as_str()))
                    .collect();
                let members = if members.is_empty() {
                    "no members".to_owned()
                } else {
                    members.join(", ")
                };
                println!("{}\towner {}\t{members}", ns.name, ns.owner);
            }
        }
        NamespaceCommand::Member(MemberCommand::Add {
            namespace,
            user,
            role,
            data_dir,
        }) => {
            let (users, namespaces) = open(&data_dir)?;
            namespaces.set_member(&namespace, &user, role.parse()?, &users)?;
            println!("{user} is a member of {namespace} as {role}");
        }
        NamespaceCommand::Member(MemberCommand::Remove {
            namespace,
            user,
            data_dir,
        }) => {
            let (_, namespaces) = open(&data_dir)?;
            namespaces.remove_member(&namespace, &user)?;
            println!("{user} is no longer a member of {namespace}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn namespace_quota(args: &QuotaArgs) -> anyhow::Result<ExitCode> {
    let ns = &args.namespace;
    labforge_web::validate::dns_label("namespace", ns).map_err(|e| anyhow::anyhow!("{e}"))?;
    let store = args.data_dir.join("store");
    let set = args.cpu.is_some()
        || args.memory.is_some()
        || args.gpus.is_some()
        || args.notebooks.is_some()
        || args.storage.is_some();
    if args.clear {
        labforge_embedded::store::write_quota(&store, ns, None)?;
    } else if set {
        let quota = labforge_web::quota::Quota {
            cpu: args.cpu.clone(),
            memory: args.memory.clone(),
            gpus: args.gpus,
            notebooks: args.notebooks,
            storage: args.storage.clone(),
        };
        if let Some(problem) = quota.problems().as_slice().first() {
            anyhow::bail!("--{}: {}", problem.field, problem.message);
        }
        labforge_embedded::store::write_quota(&store, ns, Some(&quota))?;
    }
    match labforge_embedded::store::read_quota(&store, ns)? {
        None => println!("{ns}: no quota"),
        Some(quota) => {
            let parts: Vec<String> = [
                quota.cpu.as_ref().map(|cpu| format!("cpu {cpu}")),
                quota
                    .memory
                    .as_ref()
                    .map(|memory| format!("memory {memory}")),
                quota.gpus.map(|gpus| format!("gpus {gpus}")),
                quota.notebooks.map(|n| format!("{n} running notebooks")),
                quota
                    .storage
                    .as_ref()
                    .map(|storage| format!("storage {storage}")),
            ]
            .into_iter()
            .flatten()
            .collect();
            println!("{ns}: {}", parts.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--since` as `labforge audit` takes it: an RFC 3339 time, or a span back from now.
pub(crate) fn audit_since(since: &str) -> anyhow::Result<String> {
    if since.parse::<jiff::Timestamp>().is_ok() {
        return Ok(since.to_owned());
    }
    let span: jiff::Span = since.parse().map_err(|_| {
        anyhow::anyhow!(
            "--since {since:?}: give an RFC 3339 time (2026-01-31T09:00:00Z) or a span back from now (90m, 2h, 7d)"
        )
    })?;
    let now = jiff::Zoned::now().with_time_zone(jiff::tz::TimeZone::UTC);
    Ok(now
        .checked_sub(span)
        .with_context(|| format!("--since {since:?}: too far back"))?
        .timestamp()
        .to_string())
}

pub(crate) fn audit(args: &AuditArgs) -> anyhow::Result<ExitCode> {
    let dir = args.data_dir.join(labforge_embedded::data_dir::AUDIT_DIR);
    let filter = labforge_web::audit::AuditFilter {
        user: args.user.clone(),
        namespace: args.namespace.clone(),
        since: args.since.as_deref().map(audit_since).transpose()?,
    };
    let records = labforge_web::audit::read_dir(&dir, &filter, args.limit)
        .with_context(|| format!("reading the audit trail in {}", dir.display()))?;
    for record in records {
        if args.json {
            println!("{}", serde_json::to_string(&record)?);
        } else {
            let on = match (record.namespace.as_str(), record.object.as_str()) {
                ("", _) => String::new(),
                (ns, "") => format!(" in {ns}"),
                (ns, object) => format!(" on {ns}/{object}"),
            };
            let who = if record.user.is_empty() {
                "(nobody)"
            } else {
                &record.user
            };
            let from = if record.from.is_empty() {
                "?"
            } else {
                &record.from
            };
            println!(
                "{}  {who} from {from}: {}{on} → {} {}",
                record.time, record.action, record.status, record.result
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
